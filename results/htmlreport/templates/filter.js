// Filters for the matrix: a select per column named by a data- attribute,
// and a text search over every cell. Without this script every row shows.
(function () {
  "use strict";
  var table = document.getElementById("matrix");
  var form = document.getElementById("filters");
  if (!table || !form) { return; }
  var rows = Array.prototype.slice.call(table.tBodies[0].rows).filter(function (r) { return r.dataset.engine !== undefined; });
  var keys = ["engine", "profile", "mode", "topology", "workers", "verdict"];
  var selects = {};
  var holder = document.getElementById("f-selects");
  keys.forEach(function (k) {
    var values = [];
    rows.forEach(function (r) { var v = r.dataset[k]; if (values.indexOf(v) < 0) { values.push(v); } });
    values.sort();
    var label = document.createElement("label");
    label.textContent = k + " ";
    var sel = document.createElement("select");
    sel.id = "f-" + k;
    var all = document.createElement("option");
    all.value = "";
    all.textContent = "all";
    sel.appendChild(all);
    values.forEach(function (v) {
      var o = document.createElement("option");
      o.value = v;
      o.textContent = v;
      sel.appendChild(o);
    });
    sel.addEventListener("change", apply);
    label.appendChild(sel);
    holder.appendChild(label);
    selects[k] = sel;
  });
  var text = document.getElementById("f-text");
  text.addEventListener("input", apply);
  var count = document.getElementById("f-count");
  function apply() {
    var q = text.value.trim().toLowerCase();
    var shown = 0;
    rows.forEach(function (r) {
      var ok = keys.every(function (k) { return selects[k].value === "" || r.dataset[k] === selects[k].value; });
      if (ok && q !== "") { ok = r.textContent.toLowerCase().indexOf(q) >= 0; }
      r.hidden = !ok;
      if (ok) { shown++; }
    });
    count.textContent = shown + " of " + rows.length + " rows";
  }
  form.addEventListener("submit", function (e) { e.preventDefault(); });
  form.hidden = false;
  apply();
}());
