package results

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/lipgloss/table"
	"github.com/charmbracelet/x/ansi"
)

// Format names an export format.
type Format string

// The formats. FormatTable is for terminals; FormatTSV is its stable plain
// equivalent for pipes and scripts.
const (
	FormatTable    Format = "table"
	FormatTSV      Format = "tsv"
	FormatMarkdown Format = "md"
	FormatJSON     Format = "json"
	FormatJUnit    Format = "junit"
)

// Formats lists the accepted format names.
var Formats = []Format{FormatTable, FormatTSV, FormatMarkdown, FormatJSON, FormatJUnit}

// ParseFormat accepts a format name ("markdown" is a synonym of "md").
func ParseFormat(s string) (Format, error) {
	if s == "markdown" {
		return FormatMarkdown, nil
	}
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return "", fmt.Errorf("results: unknown format %q (valid: %s)", s, strings.Join(names, ", "))
}

// Render writes rows in format f.
func Render(w io.Writer, f Format, rows []RunSummary) error {
	switch f {
	case FormatTable:
		return WriteTable(w, 0, rows)
	case FormatTSV:
		return WriteTSV(w, rows)
	case FormatMarkdown:
		return WriteMarkdown(w, rows)
	case FormatJSON:
		return WriteJSON(w, rows)
	case FormatJUnit:
		return WriteJUnit(w, rows)
	}
	_, err := ParseFormat(string(f))
	return err
}

// Columns are the result-table headers, in order. Each evidence lane is
// its own column.
var Columns = []string{"RUN", "ENGINE", "VERSION", "PROFILE", "TOPOLOGY", "MODE", "LAUNCHER", "WORKERS",
	"VERDICT", "REASON", "DIRECT", "DELIVERY", "ROUTING", "PARITY", "CACHE", "PERF", "ARTIFACT"}

// WorkersKind says what kind of workers produced a row: simulated,
// attached or launched.
func WorkersKind(t Tuple) string {
	switch {
	case t.SimulatedWorkers:
		return "simulated"
	case t.Launcher == LauncherAttach:
		return "attached"
	default:
		return "launched"
	}
}

// oneLine turns tabs and line breaks into spaces, so a cell never breaks a
// TSV line or a table row.
func oneLine(s string) string { return lineBreaks.Replace(s) }

var lineBreaks = strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")

// cells is one result row's column values, each on one line.
func cells(r RunSummary) []string {
	reason := r.ReasonCode
	if reason == "" {
		reason = "-"
	}
	c := []string{r.ID, r.Tuple.Engine, VersionCell(r.Tuple), r.Tuple.Profile, r.Tuple.Topology, r.Tuple.Mode,
		r.Tuple.Launcher, WorkersKind(r.Tuple), string(r.Verdict.Norm()), reason}
	for _, s := range r.Lanes.List() {
		c = append(c, string(s))
	}
	c = append(c, dash(short(r.ArtifactID)))
	for i := range c {
		c[i] = oneLine(c[i])
	}
	return c
}

// VersionCell is the catalog's engine version, and when the workers
// reported another one, both: "b7800≠b0-unknown" (catalog ≠ workers).
func VersionCell(t Tuple) string {
	if t.VersionMismatch && t.WorkerEngineVersion != "" {
		return dash(t.EngineVersion) + "≠" + t.WorkerEngineVersion
	}
	return dash(t.EngineVersion)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func anySimulated(rows []RunSummary) bool {
	for _, r := range rows {
		if r.Tuple.SimulatedWorkers {
			return true
		}
	}
	return false
}

// WriteTSV writes a header line and one tab-separated line per row: stable
// plain text for pipes. Tabs and line breaks inside cells become spaces.
// Simulated rows say so in the WORKERS column; the note itself is left to
// the caller (on stderr), so the output stays pure data.
func WriteTSV(w io.Writer, rows []RunSummary) error {
	data := make([][]string, len(rows))
	for i, r := range rows {
		data[i] = cells(r)
	}
	return TSV(w, Columns, data)
}

// statusColor is the lipgloss colour of a cell whose first word is a
// status ("PASS", "BLOCKED architecture_unsupported", ...).
func statusColor(cell string) (lipgloss.Color, bool) {
	first, _, _ := strings.Cut(cell, " ")
	switch Status(first) {
	case StatusPass:
		return lipgloss.Color("2"), true
	case StatusFail:
		return lipgloss.Color("1"), true
	case StatusBlocked:
		return lipgloss.Color("3"), true
	case StatusNotRun, StatusSkipped:
		return lipgloss.Color("8"), true
	}
	return "", false
}

// Table renders headers and rows as a bordered lipgloss table styled for w:
// colour only when w is a colour terminal (never under NO_COLOR), plain
// characters otherwise. Cells that start with a status word are coloured by
// status. With width > 0 no line is wider than width (see Fit; callers
// that want to name dropped columns call Fit first); 0 leaves every cell
// whole. The result has no trailing newline.
func Table(w io.Writer, width int, headers []string, rows [][]string) string {
	headers, rows, _ = FitSpec{}.Fit(width, headers, rows)
	re := lipgloss.NewRenderer(w)
	base := re.NewStyle().Padding(0, 1)
	header := base.Bold(true)
	return table.New().
		Border(lipgloss.NormalBorder()).
		BorderStyle(re.NewStyle()).
		Headers(headers...).
		Rows(rows...).
		StyleFunc(func(row, col int) lipgloss.Style {
			if row == table.HeaderRow {
				return header
			}
			if row >= 0 && row < len(rows) && col < len(rows[row]) {
				if c, ok := statusColor(rows[row][col]); ok {
					return base.Foreground(c)
				}
			}
			return base
		}).
		String()
}

// FitSpec says how a table gives way on a narrow terminal.
type FitSpec struct {
	// Drop names the columns to leave out first, in order, when even the
	// narrowest cells do not fit; then columns go from the right.
	Drop []string
	// Whole names columns never truncated (identifiers a user copies into
	// the next command): they are dropped before they are cut, and cut
	// only when one alone is wider than the terminal.
	Whole []string
	// ShrinkFirst names columns shortened to their floor before any other
	// is (details that matter less than the text beside them).
	ShrinkFirst []string
}

// Fit sizes a bordered table (one space of padding each side of a cell, a
// border between and around columns) to width terminal columns: the widest
// column is shortened first, its cells truncated with an ellipsis, until
// the table fits or every column is at its floor (its header's width, at
// most 10, and never more than its widest cell; a Whole column's floor is
// its widest cell). When the floors are still too wide, whole columns are
// dropped (see FitSpec.Drop); dropped names them. The full text is in -o
// json. width <= 0 returns the input unchanged.
func (f FitSpec) Fit(width int, headers []string, rows [][]string) (_ []string, _ [][]string, dropped []string) {
	if width <= 0 || len(headers) == 0 {
		return headers, rows, nil
	}
	keep := make([]bool, len(headers))
	natural := make([]int, len(headers))
	floor := make([]int, len(headers))
	for i, h := range headers {
		keep[i] = true
		natural[i] = ansi.StringWidth(h)
		for _, r := range rows {
			if i < len(r) {
				natural[i] = max(natural[i], ansi.StringWidth(r[i]))
			}
		}
		floor[i] = min(natural[i], max(3, min(ansi.StringWidth(h), 10)))
		if slices.Contains(f.Whole, h) {
			floor[i] = min(natural[i], max(3, width-4)) // one column alone: border, padding, border
		}
	}
	// tableWidth: every kept column's content plus 2 padding, plus n+1 borders.
	tableWidth := func(ws []int) int {
		t, n := 1, 0
		for i, w := range ws {
			if keep[i] {
				t += w + 3
				n++
			}
		}
		if n == 0 {
			return 0
		}
		return t
	}
	order := make([]int, 0, 2*len(headers))
	for _, name := range f.Drop {
		if i := slices.Index(headers, name); i >= 0 {
			order = append(order, i)
		}
	}
	for i := len(headers) - 1; i >= 0; i-- {
		if !slices.Contains(f.Whole, headers[i]) {
			order = append(order, i)
		}
	}
	for i := len(headers) - 1; i >= 0; i-- {
		order = append(order, i) // Whole columns last
	}
	kept := len(headers)
	for _, i := range order {
		if tableWidth(floor) <= width || kept == 1 {
			break
		}
		if keep[i] {
			keep[i] = false
			kept--
			dropped = append(dropped, headers[i])
		}
	}
	// Shorten the widest kept column, one cell at a time, down to its floor.
	ws := append([]int(nil), natural...)
	widest := func(first bool) int {
		w := -1
		for i := range ws {
			if first && !slices.Contains(f.ShrinkFirst, headers[i]) {
				continue
			}
			if keep[i] && ws[i] > floor[i] && (w < 0 || ws[i] > ws[w]) {
				w = i
			}
		}
		return w
	}
	for tableWidth(ws) > width {
		i := widest(true)
		if i < 0 {
			i = widest(false)
		}
		if i < 0 {
			break // one column left, at its floor: nothing more to give
		}
		ws[i]--
	}
	cut := func(cells []string) []string {
		out := make([]string, 0, kept)
		for i, c := range cells {
			if i < len(keep) && keep[i] {
				out = append(out, ansi.Truncate(c, ws[i], "…"))
			}
		}
		return out
	}
	fitted := make([][]string, len(rows))
	for i, r := range rows {
		fitted[i] = cut(r)
	}
	return cut(headers), fitted, dropped
}

// DroppedNote is the line under a table that lost columns to the
// terminal's width ("" when none did).
func DroppedNote(dropped []string) string {
	if len(dropped) == 0 {
		return ""
	}
	return "not shown at this width: " + strings.Join(dropped, " ") + " (-o json has every field)"
}

// FitLine truncates one line of text to width with an ellipsis; width <= 0
// leaves it whole.
func FitLine(width int, s string) string {
	if width <= 0 {
		return s
	}
	return ansi.Truncate(s, width, "…")
}

// TSV writes headers and rows as tab-separated lines. Tabs and line breaks
// inside cells become spaces, so every row stays one line.
func TSV(w io.Writer, headers []string, rows [][]string) error {
	var b strings.Builder
	b.WriteString(strings.Join(headers, "\t") + "\n")
	for _, r := range rows {
		for i, c := range r {
			if i > 0 {
				b.WriteByte('\t')
			}
			b.WriteString(oneLine(c))
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// tableFit is how the result table gives way on a narrow terminal:
// provenance details go first, then the engine, profile and mode (the run
// ID spells them), then the lanes; the run ID (what 'results show' takes)
// and the verdict are never cut.
var tableFit = FitSpec{
	Drop: []string{"ARTIFACT", "LAUNCHER", "TOPOLOGY", "VERSION", "WORKERS", "PERF", "CACHE", "PARITY",
		"ENGINE", "PROFILE", "MODE", "ROUTING", "DELIVERY", "DIRECT", "REASON"},
	Whole: []string{"RUN", "VERDICT"},
}

// WriteTable writes the rows as a lipgloss table (for terminals) at most
// width columns wide (0: unbounded), followed by the verdict counts and,
// when any row ran on simulated workers, the simulated-workers note.
// Columns too wide for the terminal are truncated or, when even that does
// not fit, left out and named under the table.
func WriteTable(w io.Writer, width int, rows []RunSummary) error {
	data := make([][]string, len(rows))
	for i, r := range rows {
		data[i] = cells(r)
	}
	headers, data, dropped := tableFit.Fit(width, Columns, data)
	var b strings.Builder
	b.WriteString(Table(w, width, headers, data) + "\n")
	b.WriteString(FitLine(width, Tally(rows).String()) + "\n")
	if n := DroppedNote(dropped); n != "" {
		b.WriteString(FitLine(width, n) + "\n")
	}
	if anySimulated(rows) {
		b.WriteString(FitLine(width, SimulatedNote) + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// mdEscape makes a cell safe inside a Markdown table.
func mdEscape(s string) string { return mdCell.Replace(s) }

var mdCell = strings.NewReplacer("|", `\|`, "\n", " ", "\r", " ")

// WriteMarkdown writes a Markdown table with the verdict counts and the
// simulated-workers note.
func WriteMarkdown(w io.Writer, rows []RunSummary) error {
	var b strings.Builder
	b.WriteString("| " + strings.Join(Columns, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat("---|", len(Columns)) + "\n")
	for _, r := range rows {
		c := cells(r)
		for i := range c {
			c[i] = mdEscape(c[i])
		}
		b.WriteString("| " + strings.Join(c, " | ") + " |\n")
	}
	b.WriteString("\n" + Tally(rows).String() + "\n")
	if anySimulated(rows) {
		b.WriteString("\n> " + SimulatedNote + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Export is the JSON export document.
type Export struct {
	Schema  string       `json:"schema"`
	Verdict Status       `json:"verdict"`
	Counts  Counts       `json:"counts"`
	Note    string       `json:"note,omitempty"` // SimulatedNote when any row ran on simulated workers
	Runs    []RunSummary `json:"runs"`
}

// NewExport is the export document of rows: their counts, overall verdict
// and the simulated-workers note when it applies.
func NewExport(rows []RunSummary) Export {
	c := Tally(rows)
	doc := Export{Schema: RunSchema, Verdict: c.Overall(), Counts: c, Runs: rows}
	if doc.Runs == nil {
		doc.Runs = []RunSummary{}
	}
	if anySimulated(rows) {
		doc.Note = SimulatedNote
	}
	return doc
}

// WriteJSON writes an Export document (indented, one trailing newline).
func WriteJSON(w io.Writer, rows []RunSummary) error {
	doc := NewExport(rows)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// JUnit XML: one testsuite, one testcase per run. FAIL is a <failure>,
// NOT_RUN an <error>, BLOCKED and SKIPPED are <skipped>, each with the
// status and reason code in the message, so a CI never shows them as
// passed (see WriteJUnit).
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Properties []junitProperty `xml:"properties>property,omitempty"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name       string          `xml:"name,attr"`
	Classname  string          `xml:"classname,attr"`
	Time       string          `xml:"time,attr"`
	Properties []junitProperty `xml:"properties>property,omitempty"`
	Failure    *junitResult    `xml:"failure,omitempty"`
	Error      *junitResult    `xml:"error,omitempty"`
	Skipped    *junitResult    `xml:"skipped,omitempty"`
	SystemOut  string          `xml:"system-out,omitempty"`
}

type junitResult struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Body    string `xml:",chardata"`
}

// WriteJUnit writes the rows as JUnit XML. FAIL is a failure. NOT_RUN (a
// case an interruption never reached, or a run that stopped part-way) is
// an error: nothing was qualified, and a CI job reading the file must not
// go green on it. BLOCKED and SKIPPED are skipped: the tuple is known not
// to run here (catalog or host), which is a result, not a gap.
func WriteJUnit(w io.Writer, rows []RunSummary) error {
	c := Tally(rows)
	suite := junitSuite{Name: "llmgw qualification", Tests: c.Total, Failures: c.Fail, Errors: c.NotRun, Skipped: c.Blocked + c.Skipped}
	if anySimulated(rows) {
		suite.Properties = []junitProperty{{Name: "note", Value: SimulatedNote}}
	}
	for _, r := range rows {
		tc := junitCase{
			Name:      r.CaseID,
			Classname: "llmgw." + r.Tuple.Engine + "." + r.Tuple.Profile,
			Time:      strconv.FormatFloat(r.Ended.Sub(r.Started).Seconds(), 'f', 3, 64),
			Properties: []junitProperty{
				{Name: "run", Value: r.ID},
				{Name: "engine_version", Value: r.Tuple.EngineVersion},
				{Name: "launcher", Value: r.Tuple.Launcher},
				{Name: "workers", Value: WorkersKind(r.Tuple)},
				{Name: "artifact_id", Value: r.ArtifactID},
			},
		}
		if v := r.Tuple.WorkerEngineVersion; v != "" {
			tc.Properties = append(tc.Properties, junitProperty{Name: "engine_version_reported", Value: v})
		}
		for i, s := range r.Lanes.List() {
			tc.Properties = append(tc.Properties, junitProperty{Name: "lane." + LaneNames[i], Value: string(s)})
		}
		msg := string(r.Verdict.Norm())
		if r.ReasonCode != "" {
			msg += " " + r.ReasonCode
		}
		switch r.Verdict.Norm() {
		case StatusPass:
		case StatusFail:
			tc.Failure = &junitResult{Message: msg, Type: r.ReasonCode, Body: r.Reason}
		case StatusNotRun:
			tc.Error = &junitResult{Message: msg, Type: r.ReasonCode, Body: r.Reason}
		default:
			tc.Skipped = &junitResult{Message: msg, Body: r.Reason}
		}
		if r.Tuple.SimulatedWorkers {
			tc.SystemOut = SimulatedNote
		}
		suite.Cases = append(suite.Cases, tc)
	}
	doc := junitSuites{Name: "llmgw", Tests: suite.Tests, Failures: suite.Failures, Errors: suite.Errors, Skipped: suite.Skipped, Suites: []junitSuite{suite}}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("results: junit: %w", err)
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// WriteRunDetail writes one run for `llmgw results show`: the tuple, the
// steps (a lipgloss table when tty, TSV otherwise), the lanes and the
// artifact id, and the simulated-workers note when it applies. On a tty
// with width > 0 every line fits width columns: long reasons and evidence
// lists are truncated with an ellipsis (results show -o json has them
// whole); TSV is never truncated.
func WriteRunDetail(w io.Writer, r *Run, tty bool, width int) error {
	if !tty {
		width = 0
	}
	var b strings.Builder
	t := r.Tuple
	fmt.Fprintf(&b, "run\t%s\ncase\t%s\nverdict\t%s\n", r.ID, t.CaseID(), r.Verdict.Norm())
	fmt.Fprintf(&b, "engine\t%s %s\nprofile\t%s\ntopology\t%s\nmode\t%s\nlauncher\t%s\nworkers\t%s",
		t.Engine, dash(t.EngineVersion), t.Profile, t.Topology, t.Mode, t.Launcher, WorkersKind(t))
	if t.Workers > 0 {
		fmt.Fprintf(&b, " (%d)", t.Workers)
	}
	if t.WorkerEngineVersion != "" {
		note := "as the catalog"
		if t.VersionMismatch {
			note = "MISMATCH with the catalog's " + dash(t.EngineVersion)
		}
		fmt.Fprintf(&b, "\nreported\t%s %s (%s)", t.Engine, oneLine(t.WorkerEngineVersion), note)
	}
	fmt.Fprintf(&b, "\nstarted\t%s\nended\t%s\nartifact\t%s\n", r.Started.UTC().Format(time.RFC3339), r.Ended.UTC().Format(time.RFC3339), dash(r.ArtifactID))
	lanes := r.Lanes.List()
	parts := make([]string, len(lanes))
	for i, s := range lanes {
		parts[i] = LaneNames[i] + "=" + string(s)
	}
	fmt.Fprintf(&b, "lanes\t%s\n", strings.Join(parts, " "))
	if len(r.LaneSources) > 0 {
		var src []string
		for _, n := range LaneNames {
			if v, ok := r.LaneSources[n]; ok {
				src = append(src, n+"="+oneLine(v))
			}
		}
		fmt.Fprintf(&b, "sources\t%s\n", strings.Join(src, " "))
	}
	b.WriteString("\n")

	headers := []string{"STEP", "STATUS", "CODE", "DURATION", "REASON", "EVIDENCE"}
	data := make([][]string, len(r.Steps))
	for i, st := range r.Steps {
		data[i] = []string{st.Name, string(st.Status.Norm()), dash(st.ReasonCode), st.DurationText(), dash(st.Reason), dash(strings.Join(st.Evidence, ","))}
		for j := range data[i] {
			data[i][j] = oneLine(data[i][j]) // lipgloss would wrap a row at a line break
		}
	}
	if tty {
		// Step names and statuses stay whole; the evidence list gives way
		// before the reason.
		h, d, dropped := FitSpec{Whole: []string{"STEP", "STATUS"}, ShrinkFirst: []string{"EVIDENCE"}}.Fit(width, headers, data)
		b.WriteString(Table(w, width, h, d) + "\n")
		if n := DroppedNote(dropped); n != "" {
			b.WriteString(n + "\n")
		}
	} else if err := TSV(&b, headers, data); err != nil {
		return err
	}
	if t.SimulatedWorkers {
		b.WriteString(SimulatedNote + "\n")
	}
	out := b.String()
	if width > 0 {
		lines := strings.Split(out, "\n")
		for i := range lines {
			if k, v, ok := strings.Cut(lines[i], "\t"); ok {
				lines[i] = fmt.Sprintf("%-10s%s", k, v) // a tab's width depends on the terminal
			}
			lines[i] = FitLine(width, lines[i])
		}
		out = strings.Join(lines, "\n")
	}
	_, err := io.WriteString(w, out)
	return err
}
