package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// get answers a GET with the key as status and body.
func (f *fixture) get(t *testing.T, path, key string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", f.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

func ids(sbs []*torpor.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	return out
}

// A list asked for by pages comes in pages of at most the limit, each
// with the cursor of the next until the last, and together they are the
// whole list in its order; without a limit the answer is the whole list
// with no cursor, as before paging existed.
func TestListPages(t *testing.T) {
	f := newFixture(t)
	for range 7 {
		if _, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"team": "ml"}}); err != nil {
			t.Fatal(err)
		}
	}
	other, err := f.adminCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := f.tenantCl.List(ctx, client.ListOptions{})
	if err != nil || len(whole) != 7 {
		t.Fatalf("List: %d sandboxes, %v", len(whole), err)
	}

	status, body := f.get(t, "/v1/sandboxes", f.acmeKey)
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); status != 200 || err != nil || len(top) != 1 || top["sandboxes"] == nil {
		t.Fatalf("the list without a limit: %d, keys %v, %v", status, top, err)
	}

	var pages [][]string
	for page, err := range f.tenantCl.Pages(ctx, client.ListOptions{}, 3) {
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, ids(page))
	}
	want := ids(whole)
	if !slices.EqualFunc(pages, [][]string{want[:3], want[3:6], want[6:]}, slices.Equal) {
		t.Fatalf("pages of 3: %v, want %v", pages, want)
	}

	// A page that holds exactly the rest is the last: no cursor.
	page, next, err := f.tenantCl.ListPage(ctx, client.ListOptions{}, 7, "")
	if err != nil || next != "" || !slices.Equal(ids(page), want) {
		t.Fatalf("a page of 7 of 7: %v next %q, %v", ids(page), next, err)
	}
	// Filters hold across pages; another tenant's sandboxes never show.
	page, next, err = f.tenantCl.ListPage(ctx, client.ListOptions{Metadata: map[string]string{"team": "ml"}}, 5, "")
	if err != nil || next == "" || !slices.Equal(ids(page), want[:5]) {
		t.Fatalf("first page of team=ml: %v next %q, %v", ids(page), next, err)
	}
	page, next, err = f.tenantCl.ListPage(ctx, client.ListOptions{Metadata: map[string]string{"team": "ml"}}, 5, next)
	if err != nil || next != "" || !slices.Equal(ids(page), want[5:]) {
		t.Fatalf("second page of team=ml: %v next %q, %v", ids(page), next, err)
	}
	var all []string
	for page, err := range f.adminCl.Pages(ctx, client.ListOptions{Tenant: client.AllTenants}, 2) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ids(page)...)
	}
	if len(all) != 8 || !slices.Contains(all, other.ID) {
		t.Fatalf("every tenant's by 2: %v", all)
	}

	// A caller that stops ranging stops the walk.
	n := 0
	for range f.tenantCl.Pages(ctx, client.ListOptions{}, 1) {
		n++
		if n == 2 {
			break
		}
	}
	if n != 2 {
		t.Fatalf("ranged %d pages", n)
	}
}

// ?latest=true answers the cursor of the caller's newest event and no
// events: a follower from it sees what happens next and nothing before.
func TestLatestEventCursor(t *testing.T) {
	f := newFixture(t)
	if c, err := f.tenantCl.LatestEvent(ctx, ""); err != nil || c != 0 {
		t.Fatalf("latest of no events: %d, %v", c, err)
	}
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.tenantCl.Pause(ctx, sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	evs, _, err := f.tenantCl.Events(ctx, "", 0)
	if err != nil || len(evs) == 0 {
		t.Fatalf("events: %v, %v", evs, err)
	}
	newest := evs[len(evs)-1].Seq
	// Another tenant's later event does not move acme's cursor.
	if _, err := f.adminCl.Create(ctx, torpor.CreateRequest{Template: "base"}); err != nil {
		t.Fatal(err)
	}
	if c, err := f.tenantCl.LatestEvent(ctx, ""); err != nil || c != newest {
		t.Fatalf("latest: %d, %v; want %d", c, err, newest)
	}
	if c, err := f.tenantCl.LatestEvent(ctx, sb.ID); err != nil || c != newest {
		t.Fatalf("latest of %s: %d, %v; want %d", sb.ID, c, err, newest)
	}
	status, body := f.get(t, "/v1/events?latest=true", f.acmeKey)
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); status != 200 || err != nil || string(top["events"]) != "[]" {
		t.Fatalf("latest answer: %d %s", status, body)
	}
	// Past the newest, the cursor stays where the caller put it.
	status, body = f.get(t, "/v1/events?latest=true&since=999999", f.acmeKey)
	if err := json.Unmarshal(body, &top); status != 200 || err != nil || string(top["next"]) != "999999" {
		t.Fatalf("latest past the end: %d %s", status, body)
	}
	if status, _ := f.get(t, "/v1/sandboxes/nosuch/events?latest=true", f.acmeKey); status != 404 {
		t.Fatalf("latest of an unknown sandbox: %d", status)
	}

	got := make(chan torpor.Event, 10)
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go f.tenantCl.FollowEvents(fctx, "", newest, func(ev torpor.Event) error { got <- ev; return nil })
	if _, err := f.tenantCl.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-got:
		if ev.Type != torpor.EventResumed || ev.SandboxID != sb.ID {
			t.Fatalf("the follower from the latest cursor got %+v first", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the follower from the latest cursor got nothing")
	}
}

// A stream asked for with ?latest=true starts after the newest event; a
// reconnection (Last-Event-ID) goes on from its own last event instead,
// and so misses nothing.
func TestLatestEventStream(t *testing.T) {
	f := newFixture(t)
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	first := func(lastEventID string) torpor.Event {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(sctx, "GET", f.url+"/v1/events?latest=true", nil)
		req.Header.Set("Authorization", "Bearer "+f.acmeKey)
		req.Header.Set("Accept", "text/event-stream")
		if lastEventID != "" {
			req.Header.Set("Last-Event-ID", lastEventID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream: %v %v", resp, err)
		}
		defer resp.Body.Close()
		got := make(chan torpor.Event, 1)
		go func() {
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					var ev torpor.Event
					json.Unmarshal([]byte(data), &ev)
					got <- ev
					return
				}
			}
		}()
		if lastEventID == "" {
			if _, err := f.tenantCl.Pause(ctx, sb.ID, ""); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case ev := <-got:
			return ev
		case <-sctx.Done():
			t.Fatal("the stream sent nothing")
		}
		return torpor.Event{}
	}
	if ev := first(""); ev.Type != torpor.EventPaused || ev.SandboxID != sb.ID {
		t.Fatalf("the stream from the latest cursor began with %+v", ev)
	}
	if ev := first("0"); ev.Type != torpor.EventCreated {
		t.Fatalf("a reconnection from 0 with latest began with %+v", ev)
	}
}
