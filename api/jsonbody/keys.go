package jsonbody

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"strings"

	"github.com/torpor-dev/torpor"
)

// checkKeys walks the tokens of data, one JSON value that decoded into v
// already, and refuses an object that holds a key twice. Where an object
// decodes into a struct, two keys that encoding/json maps to the same
// field ("template" and "Template": it matches names regardless of case)
// are the same key as well.
func checkKeys(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walk(dec, reflect.TypeOf(v), "")
}

// walk reads one value from dec, checking the keys of every object in it.
// t is the Go type the value decodes into, nil where that is not known (an
// interface, a field v does not define, a type that decodes itself).
func walk(dec *json.Decoder, t reflect.Type, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return fieldError(err)
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	t = plain(t)
	switch delim {
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walk(dec, elem, indexPath(path, i)); err != nil {
				return err
			}
		}
	case '{':
		seen := map[string]string{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return fieldError(err)
			}
			key, _ := tok.(string)
			p := keyPath(path, key)
			id, child := member(t, key)
			if first, dup := seen[id]; dup {
				if first == key {
					return torpor.Invalid(p, "the key %q appears more than once", key)
				}
				return torpor.Invalid(p, "the key %q sets the same field as %q (names match regardless of case)", key, first)
			}
			seen[id] = key
			if err := walk(dec, child, p); err != nil {
				return err
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		return fieldError(err)
	}
	return nil
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// plain follows pointers to the type a value decodes into, and returns nil
// for a type whose own method decodes it: what that method makes of a key
// is not encoding/json's rule, so its keys are compared exactly.
func plain(t reflect.Type) reflect.Type {
	for t != nil {
		if t.Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(jsonUnmarshaler) ||
			t.Implements(textUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
			return nil
		}
		if t.Kind() != reflect.Pointer {
			return t
		}
		t = t.Elem()
	}
	return nil
}

// member says what key sets in an object decoded into t: the identity two
// keys share when they set the same thing, and the type of its value
// (nil when not known).
func member(t reflect.Type, key string) (id string, child reflect.Type) {
	if t == nil {
		return key, nil
	}
	switch t.Kind() {
	case reflect.Map:
		return key, t.Elem()
	case reflect.Struct:
		fields := structFields(t)
		for _, f := range fields {
			if f.name == key {
				return "field:" + f.name, f.typ
			}
		}
		for _, f := range fields {
			if strings.EqualFold(f.name, key) {
				return "field:" + f.name, f.typ
			}
		}
	}
	return key, nil
}

// field is a JSON member of a struct: its name and Go type.
type field struct {
	name string
	typ  reflect.Type
}

// structFields lists the JSON members of struct type t as encoding/json
// finds them: exported fields by their tag's name (or their own), "-"
// left out, and the fields of untagged embedded structs promoted, a
// shallower one hiding a deeper one of the same name.
func structFields(t reflect.Type) []field {
	var out []field
	have := map[string]bool{}
	level := []reflect.Type{t}
	visited := map[reflect.Type]bool{}
	for len(level) > 0 {
		var next []reflect.Type
		var found []field
		for _, st := range level {
			if visited[st] {
				continue
			}
			visited[st] = true
			for i := range st.NumField() {
				sf := st.Field(i)
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, _, _ := strings.Cut(tag, ",")
				ft := sf.Type
				if sf.Anonymous && name == "" {
					et := ft
					if et.Kind() == reflect.Pointer {
						et = et.Elem()
					}
					if et.Kind() == reflect.Struct {
						next = append(next, et)
						continue
					}
				}
				if !sf.IsExported() {
					continue
				}
				if name == "" {
					name = sf.Name
				}
				found = append(found, field{name: name, typ: ft})
			}
		}
		for _, f := range found {
			if !have[f.name] {
				have[f.name] = true
				out = append(out, f)
			}
		}
		level = next
	}
	return out
}
