package wire

import "github.com/torpor-dev/torpor"

// SecretRequest is the body of PUT /v1/secrets/{name}: the value, as
// text. No response ever holds it.
type SecretRequest struct {
	Value string `json:"value"`
}

// SecretList is the body of GET /v1/secrets: metadata only.
type SecretList struct {
	Secrets []torpor.Secret `json:"secrets"`
}
