package results

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/lipgloss/table"
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
		return WriteTable(w, rows)
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

// workersKind says what kind of workers produced a row.
func workersKind(t Tuple) string {
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
	c := []string{r.ID, r.Tuple.Engine, versionCell(r.Tuple), r.Tuple.Profile, r.Tuple.Topology, r.Tuple.Mode,
		r.Tuple.Launcher, workersKind(r.Tuple), string(r.Verdict.Norm()), reason}
	for _, s := range r.Lanes.List() {
		c = append(c, string(s))
	}
	c = append(c, dash(short(r.ArtifactID)))
	for i := range c {
		c[i] = oneLine(c[i])
	}
	return c
}

// versionCell is the catalog's engine version, and when the workers
// reported another one, both: "b7800≠b0-unknown" (catalog ≠ workers).
func versionCell(t Tuple) string {
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
// status. The result has no trailing newline.
func Table(w io.Writer, headers []string, rows [][]string) string {
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

// WriteTable writes the rows as a lipgloss table (for terminals), followed
// by the verdict counts and, when any row ran on simulated workers, the
// simulated-workers note.
func WriteTable(w io.Writer, rows []RunSummary) error {
	data := make([][]string, len(rows))
	for i, r := range rows {
		data[i] = cells(r)
	}
	var b strings.Builder
	b.WriteString(Table(w, Columns, data) + "\n")
	b.WriteString(Tally(rows).String() + "\n")
	if anySimulated(rows) {
		b.WriteString(SimulatedNote + "\n")
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

// WriteJSON writes an Export document (indented, one trailing newline).
func WriteJSON(w io.Writer, rows []RunSummary) error {
	c := Tally(rows)
	doc := Export{Schema: RunSchema, Verdict: c.Overall(), Counts: c, Runs: rows}
	if doc.Runs == nil {
		doc.Runs = []RunSummary{}
	}
	if anySimulated(rows) {
		doc.Note = SimulatedNote
	}
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
				{Name: "workers", Value: workersKind(r.Tuple)},
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
// artifact id, and the simulated-workers note when it applies.
func WriteRunDetail(w io.Writer, r *Run, tty bool) error {
	var b strings.Builder
	t := r.Tuple
	fmt.Fprintf(&b, "run\t%s\ncase\t%s\nverdict\t%s\n", r.ID, t.CaseID(), r.Verdict.Norm())
	fmt.Fprintf(&b, "engine\t%s %s\nprofile\t%s\ntopology\t%s\nmode\t%s\nlauncher\t%s\nworkers\t%s",
		t.Engine, dash(t.EngineVersion), t.Profile, t.Topology, t.Mode, t.Launcher, workersKind(t))
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
		d := "-"
		if !st.Started.IsZero() && !st.Ended.IsZero() {
			d = st.Ended.Sub(st.Started).Round(time.Millisecond).String()
		}
		data[i] = []string{st.Name, string(st.Status.Norm()), dash(st.ReasonCode), d, dash(st.Reason), dash(strings.Join(st.Evidence, ","))}
		for j := range data[i] {
			data[i][j] = oneLine(data[i][j]) // lipgloss would wrap a row at a line break
		}
	}
	if tty {
		b.WriteString(Table(w, headers, data) + "\n")
	} else if err := TSV(&b, headers, data); err != nil {
		return err
	}
	if t.SimulatedWorkers {
		b.WriteString(SimulatedNote + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
