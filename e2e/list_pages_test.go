package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestListPagesWhileCreating walks the sandbox list by pages through the
// real daemon while sandboxes are being created, by the CLI between pages
// and by another client all along: the walk sees no sandbox twice, every
// sandbox that existed when it started, and every one created between its
// pages (its create began after the page before was read). Another
// client's create that began before a page was read and was stored after
// it may be missed (docs/api.md), so those are only counted.
func TestListPagesWhileCreating(t *testing.T) {
	needs(t)
	// 7 + 3 + 6 sandboxes: room for them all.
	d := startDaemon(t, torporBin(t), t.TempDir(), "TORPOR_CAPACITY_VCPUS=32")
	cl := d.client(t)
	ctx := context.Background()
	small := &torpor.Resources{VCPUs: 1, MemoryMiB: 16, DiskMiB: 64}
	create := func(tag string) string {
		t.Helper()
		sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: small, Metadata: map[string]string{"walk": tag}})
		if err != nil {
			t.Fatal(err)
		}
		return sb.ID
	}
	var before []string
	for range 7 {
		before = append(before, create("before"))
	}

	// Another client creates sandboxes while the walk goes on.
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		answered []string // creates that had answered before the last page
	)
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: small, Metadata: map[string]string{"walk": "during"}})
			if err != nil {
				t.Errorf("create %d during the walk: %v", i, err)
				return
			}
			mu.Lock()
			answered = append(answered, sb.ID)
			mu.Unlock()
			if i == 5 {
				return
			}
		}
	}()

	seen := map[string]int{}
	var between []string
	pages := 0
	// snap is, at the end of each page's turn, the creates that have
	// answered: the next page is read after them. beforeRead is, for the
	// page in hand, the snap taken before it was read.
	var snap, beforeRead []string
	for page, err := range cl.Pages(ctx, client.ListOptions{}, 3) {
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 3 {
			t.Fatalf("a page of limit 3 has %d sandboxes", len(page))
		}
		beforeRead = snap
		pages++
		for _, sb := range page {
			seen[sb.ID]++
		}
		if pages <= 3 {
			between = append(between, strings.TrimSpace(d.ok("create", "-m", "walk=cli")))
		}
		mu.Lock()
		snap = append([]string(nil), answered...)
		mu.Unlock()
	}
	close(stop)
	wg.Wait()

	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s seen %d times", id, n)
		}
	}
	for _, group := range []struct {
		what string
		ids  []string
	}{{"created before the walk", before}, {"created by the CLI between pages", between}} {
		for _, id := range group.ids {
			if seen[id] != 1 {
				t.Errorf("%s (%s) seen %d times, want once", id, group.what, seen[id])
			}
		}
	}
	all, err := cl.List(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) > len(all) {
		t.Errorf("the walk saw %d sandboxes, the whole list has %d", len(seen), len(all))
	}
	t.Logf("%d pages, %d sandboxes seen of %d; %d created by the other client, %d of them before the last page", pages, len(seen), len(all), len(answered), len(beforeRead))
}
