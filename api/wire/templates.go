package wire

// Server-sent event names of a streamed template import or build
// (POST /v1/templates and /v1/templates/build with Accept:
// text/event-stream). "progress" events carry TemplateProgress; the last
// event is "template" with the template object, or "error" with an
// ErrorBody.
const (
	EventProgress = "progress"
	EventTemplate = "template"
)

// TemplateProgress is one line of an import's or a build's progress.
type TemplateProgress struct {
	Message string `json:"message"`
}
