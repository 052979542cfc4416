package torpor_test

import (
	"testing"

	"github.com/torpor-dev/torpor"
)

func TestParsePoolSpec(t *testing.T) {
	for _, c := range []struct {
		in   string
		want torpor.PoolConfig
		bad  bool
	}{
		{in: "base=4", want: torpor.PoolConfig{Template: "base", Size: 4}},
		{in: "python=0", want: torpor.PoolConfig{Template: "python"}},
		{in: "base=2:internet", want: torpor.PoolConfig{Template: "base", Size: 2, AllowInternet: true}},
		{in: "base=64", want: torpor.PoolConfig{Template: "base", Size: 64}},
		{in: "base", bad: true},
		{in: "=4", bad: true},
		{in: "base=", bad: true},
		{in: "base=four", bad: true},
		{in: "base=-1", bad: true},
		{in: "base=65", bad: true},
		{in: "base=2:net", bad: true},
	} {
		got, err := torpor.ParsePoolSpec(c.in)
		switch {
		case c.bad && !torpor.IsCode(err, torpor.EInvalid):
			t.Errorf("ParsePoolSpec(%q) = %+v, %v; want invalid", c.in, got, err)
		case !c.bad && (err != nil || got != c.want):
			t.Errorf("ParsePoolSpec(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}
