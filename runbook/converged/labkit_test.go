package converged

import "github.com/llmgw/llmgw/runbook/labkit"

// The parsers moved to labkit; the package's fuzz targets keep exercising
// them under their former names.
var (
	parseSSE        = labkit.ParseSSE
	parseCompletion = labkit.ParseCompletion
)
