package jsonbody_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/jsonbody"
)

type inner struct {
	VCPUs  int `json:"vcpus"`
	Memory int `json:"memory_mib"`
}

type Embedded struct {
	Team string `json:"team"`
}

type request struct {
	Embedded
	Template  string            `json:"template"`
	Resources *inner            `json:"resources"`
	Metadata  map[string]string `json:"metadata"`
	Hooks     []inner           `json:"hooks"`
	Any       any               `json:"any"`
	Raw       json.RawMessage   `json:"raw"`
	Skipped   string            `json:"-"`
}

func TestDecode(t *testing.T) {
	e2b := jsonbody.Rules{AllowUnknownFields: true, AllowNoContentType: true}
	for _, tc := range []struct {
		name, body, ctype string
		rules             jsonbody.Rules
		param             string // "" accepts it
	}{
		{"plain", `{"template":"a","resources":{"vcpus":1}}`, "application/json", jsonbody.Rules{}, ""},
		{"charset", `{"template":"a"}`, "application/json; charset=utf-8", jsonbody.Rules{}, ""},
		{"empty", "  \n", "", jsonbody.Rules{}, ""},
		{"no content type", `{"template":"a"}`, "", jsonbody.Rules{}, "Content-Type"},
		{"no content type, allowed", `{"template":"a"}`, "", e2b, ""},
		{"another content type", `{"template":"a"}`, "text/plain", e2b, "Content-Type"},
		{"too large", `{"template":"` + strings.Repeat("a", 100) + `"}`, "application/json", jsonbody.Rules{Limit: 64}, "body"},
		{"malformed", `{"template":`, "application/json", jsonbody.Rules{}, "body"},
		{"two values", `{}{}`, "application/json", jsonbody.Rules{}, "body"},
		{"not an object", `[]`, "application/json", jsonbody.Rules{}, "body"},
		{"wrong type", `{"resources":{"vcpus":"two"}}`, "application/json", jsonbody.Rules{}, "resources.vcpus"},
		{"wrong type in an embedded struct", `{"team":1}`, "application/json", jsonbody.Rules{}, "team"},
		{"unknown field", `{"cpu":1}`, "application/json", jsonbody.Rules{}, "cpu"},
		{"unknown field, allowed", `{"cpu":1}`, "application/json", e2b, ""},
		{"skipped field is unknown", `{"Skipped":"x"}`, "application/json", jsonbody.Rules{}, "Skipped"},

		{"duplicate", `{"template":"a","template":"b"}`, "application/json", jsonbody.Rules{}, "template"},
		{"duplicate in another case", `{"template":"a","TEMPLATE":"b"}`, "application/json", jsonbody.Rules{}, "TEMPLATE"},
		{"duplicate, both in another case", `{"Template":"a","tEmplate":"b"}`, "application/json", jsonbody.Rules{}, "tEmplate"},
		{"duplicate of an embedded field", `{"team":"a","Team":"b"}`, "application/json", jsonbody.Rules{}, "Team"},
		{"duplicate nested", `{"resources":{"vcpus":1,"memory_mib":2,"vcpus":3}}`, "application/json", jsonbody.Rules{}, "resources.vcpus"},
		{"duplicate in an array", `{"hooks":[{"vcpus":1},{"vcpus":1,"VCPUS":2}]}`, "application/json", jsonbody.Rules{}, "hooks[1].VCPUS"},
		{"duplicate map key", `{"metadata":{"k":"a","k":"b"}}`, "application/json", jsonbody.Rules{}, "metadata.k"},
		{"map keys differ in case", `{"metadata":{"k":"a","K":"b"}}`, "application/json", jsonbody.Rules{}, ""},
		{"duplicate deep in any", `{"any":[[{"a":{"b":1,"b":2}}]]}`, "application/json", jsonbody.Rules{}, "any[0][0].a.b"},
		{"keys of any differ in case", `{"any":{"a":1,"A":2}}`, "application/json", jsonbody.Rules{}, ""},
		{"duplicate in a raw message", `{"raw":{"x":1,"x":2}}`, "application/json", jsonbody.Rules{}, "raw.x"},
		{"duplicate unknown field", `{"x":1,"x":2}`, "application/json", e2b, "x"},
		{"unknown fields in another case", `{"x":1,"X":2}`, "application/json", e2b, ""},
		{"same key in sibling objects", `{"hooks":[{"vcpus":1},{"vcpus":2}],"resources":{"vcpus":1}}`, "application/json", jsonbody.Rules{}, ""},
		{"duplicate at the top of a map", `{"a":1,"a":1}`, "application/json", jsonbody.Rules{}, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", strings.NewReader(tc.body))
			if tc.ctype != "" {
				r.Header.Set("Content-Type", tc.ctype)
			}
			var v any = &request{}
			if tc.name == "duplicate at the top of a map" {
				v = &map[string]int{}
			}
			present, err := jsonbody.Decode(r, v, tc.rules)
			if tc.param == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if present != (strings.TrimSpace(tc.body) != "") {
					t.Errorf("present = %v", present)
				}
				return
			}
			e := torpor.AsError(err)
			if err == nil || e.Code != torpor.EInvalid || e.Param != tc.param || e.Message == "" {
				t.Fatalf("got %v (param %q), want invalid naming %q", err, e.Param, tc.param)
			}
		})
	}
}
