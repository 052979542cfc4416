package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/network"
)

// stormSize is how big a storm is: the sandboxes it keeps alive, the
// workers that send requests, and for how long.
type stormSize struct {
	sandboxes int
	workers   int
	duration  time.Duration
}

// stormSizeFor is the CI storm, or under TORPOR_SOAK=1 the soak: a
// thousand sandboxes alive at once (the bridge takes 1024 ports, so this
// is about as many as one node's network holds).
func stormSizeFor() stormSize {
	if os.Getenv(soakEnv) != "" {
		return stormSize{sandboxes: 1000, workers: 16, duration: 4 * time.Minute}
	}
	return stormSize{sandboxes: 60, workers: 8, duration: 30 * time.Second}
}

const (
	// stormBound is how long a request may take: one that takes longer
	// is stuck.
	stormBound = 30 * time.Second
	// The sandboxes are small: 32 MiB of memory, a 64 MiB disk.
	stormMemoryMiB = 32
	stormDiskMiB   = 64
	// After the storm the daemon's open files and goroutines must come
	// back to within these margins of the baseline, and its resident
	// memory to within this margin of what the first round left. A leak
	// of one descriptor or goroutine per sandbox or per request exceeds
	// them many times over; the memory margin leaves room for the heap the
	// Go runtime keeps after a peak, which a leak of a few KiB per request
	// exceeds in the soak (tens of thousands of requests a round).
	stormFDMargin        = 10
	stormGoroutineMargin = 10
	stormRSSMarginMiB    = 20
	// stormSettle is how long the daemon gets to come back to its
	// baseline: the proxy closes kept-alive connections to sandboxes'
	// ports after 30 s idle, and its sweep runs every 30 s.
	stormSettle = 75 * time.Second
)

// TestStorm: a pool of small real sandboxes, some serving HTTP through
// the proxy and some with an idle policy, takes random concurrent verbs,
// commands, file operations, background processes, run_code and proxied
// requests from many workers. Every request must be answered within
// stormBound, none with a 5xx (capacity is never provoked: the node lends
// twice what the pool takes) nor a 4xx other than the 404, 409 and 410
// that racing verbs earn, and every answer must be right. After each of
// the rounds every sandbox is running, paused or hibernated as runc and
// the host say, and works; once they are all deleted the host holds
// nothing of them, the daemon's descriptors and goroutines come back to
// their baseline, and its memory to what the first round left.
func TestStorm(t *testing.T) {
	needs(t)
	size := stormSizeFor()
	env := stormNetwork(t)
	env = append(env,
		"TORPOR_CAPACITY_VCPUS="+strconv.Itoa(2*size.sandboxes+16),
		"TORPOR_CAPACITY_MEMORY_MIB="+strconv.Itoa(2*stormMemoryMiB*(size.sandboxes+16)))
	d := startDaemon(t, torporBin(t), t.TempDir(), env...)
	s := newStorm(t, d, size)

	// Warm up: one of each operation, so that what the daemon makes once
	// (the template's layers, pools, the store's caches) is in the
	// baseline; then delete, close, and measure.
	warm := s.populate(4)
	w := s.worker(0)
	for _, sb := range warm {
		for _, op := range stormOps {
			if op.name != "delete" && op.name != "create" {
				op.run(w, sb)
			}
		}
	}
	s.deleteAll(warm)
	s.failOnProblems("the warm-up")
	base := s.settle(nil)
	t.Logf("baseline: %s", base)

	stopSampling := s.sampleHost()
	defer stopSampling()
	var after []stormFigures
	for round := 1; round <= stormRounds; round++ {
		s.round(round, size)
		after = append(after, s.settle(&base))
	}
	stopSampling()
	s.summary(base, after)
	// Descriptors and goroutines come back to the baseline. Memory comes
	// back to what the first round left: what it holds after one round
	// (the store's page caches over a bigger database, the proxy's cache
	// of sandboxes, the heap the runtime keeps after a peak) is bounded,
	// where a leak grows again with every round.
	last, first := after[len(after)-1], after[0]
	if last.fds > base.fds+stormFDMargin || last.goroutines > base.goroutines+stormGoroutineMargin ||
		last.rssKiB > first.rssKiB+stormRSSMarginMiB<<10 {
		t.Fatalf("the daemon did not come back: before %s; after the first round %s; after the last %s", base, first, last)
	}
}

// stormRounds is how many times the storm fills the pool, storms it and
// deletes every sandbox; each round takes its share of the duration.
const stormRounds = 2

// round is one round of the storm: the pool is created, stormed for the
// round's share of the duration, checked, and deleted, and the host
// checked for what the sandboxes left.
func (s *storm) round(n int, size stormSize) {
	t := s.t
	start := time.Now()
	s.populate(size.sandboxes)
	t.Logf("round %d: created %d sandboxes in %s", n, size.sandboxes, time.Since(start).Round(time.Millisecond))
	s.storm(size.workers, size.sandboxes, size.duration/stormRounds)
	s.failOnProblems("the storm")
	s.checkSandboxes()
	live := s.pool.all()
	start = time.Now()
	s.deleteAll(live)
	t.Logf("round %d: deleted %d sandboxes in %s", n, len(live), time.Since(start).Round(time.Millisecond))
	s.failOnProblems("the deletion")
	rig := &crashRig{t: t, kind: "runc", dataDir: s.d.dataDir, tally: map[string]int{}}
	rig.checkHost(t, s.d)
	if t.Failed() {
		t.FailNow()
	}
}

// privateNetwork gives a test's daemons a bridge of their own, named
// prefix and six random hex digits, with the address range cidr makes of a
// random byte: it returns the bridge and the daemon's environment, and
// removes what the daemons leave of it when the test ends (registered
// before they start, this runs after they stop).
func privateNetwork(t *testing.T, prefix string, cidr func(b byte) string) (string, []string) {
	var b [3]byte
	rand.Read(b[:])
	bridge := prefix + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "delete", bridge).Run()
		if c, err := nftables.New(); err == nil {
			c.DelTable(&nftables.Table{Name: bridge, Family: nftables.TableFamilyINet})
			c.DelTable(&nftables.Table{Name: bridge, Family: nftables.TableFamilyBridge})
			_ = c.Flush()
		}
		_ = os.RemoveAll(filepath.Join(network.DefaultStateDir, bridge))
	})
	return bridge, []string{"TORPOR_NETWORK_BRIDGE=" + bridge, "TORPOR_NETWORK_CIDR=" + cidr(b[0])}
}

// stormNetwork gives the storm a network of its own (privateNetwork), a
// /20 so that a thousand sandboxes have addresses, apart from other
// tests' sandboxes.
func stormNetwork(t *testing.T) []string {
	_, env := privateNetwork(t, "tps", func(b byte) string { return fmt.Sprintf("10.218.%d.0/20", b&0xf0) })
	return env
}

// storm is one storm's daemon, pool and findings.
type storm struct {
	t      *testing.T
	d      *daemon
	api    *http.Client
	proxy  *http.Client
	pool   stormPool
	stats  stormStats
	serial atomic.Int64
	// What the host held at its fullest: its tasks (threads) and the
	// least memory it had available.
	peakTasks     int
	leastAvailMiB int
}

// sampleHost samples the host's tasks and available memory every second
// until the returned function is first called.
func (s *storm) sampleHost() (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	s.leastAvailMiB = 1 << 30
	go func() {
		defer close(stopped)
		for {
			if b, err := os.ReadFile("/proc/loadavg"); err == nil {
				if f := strings.Fields(string(b)); len(f) > 3 {
					_, total, _ := strings.Cut(f[3], "/")
					n, _ := strconv.Atoi(total)
					s.peakTasks = max(s.peakTasks, n)
				}
			}
			if b, err := os.ReadFile("/proc/meminfo"); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
						kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
						s.leastAvailMiB = min(s.leastAvailMiB, kb>>10)
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return sync.OnceFunc(func() { close(done); <-stopped })
}

func newStorm(t *testing.T, d *daemon, size stormSize) *storm {
	transport := func() *http.Transport {
		return &http.Transport{MaxIdleConns: 2 * size.workers, MaxIdleConnsPerHost: 2 * size.workers, IdleConnTimeout: 30 * time.Second}
	}
	return &storm{t: t, d: d, api: &http.Client{Transport: transport()}, proxy: &http.Client{Transport: transport()},
		stats: stormStats{kinds: map[string]*stormKind{}}}
}

// stormSandbox is a sandbox of the pool. Web ones serve /index.html on
// port 8080 ("hi\n"); idle ones pause after 3 idle seconds.
type stormSandbox struct {
	id, token string
	web, idle bool
	// deleting is when a worker first sent this sandbox's delete (Unix
	// nanoseconds; 0: never): an answer cut after that is the delete's.
	deleting atomic.Int64
}

// cutByDelete says whether a delete of sb was sent before now, so that
// an answer whose body broke off may have lost its sandbox under it.
func (sb *stormSandbox) cutByDelete() bool {
	at := sb.deleting.Load()
	return at != 0 && at <= time.Now().UnixNano()
}

// errCutAnswer is an answer whose status came and whose body broke off.
var errCutAnswer = errors.New("the answer broke off")

// stormPool holds the sandboxes the storm believes alive: a worker may
// still pick one another is deleting, as users race.
type stormPool struct {
	mu   sync.Mutex
	live []*stormSandbox
	peak int
	made int
}

func (p *stormPool) add(sb *stormSandbox) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live = append(p.live, sb)
	p.made++
	p.peak = max(p.peak, len(p.live))
}

func (p *stormPool) remove(sb *stormSandbox) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live = slices.DeleteFunc(p.live, func(o *stormSandbox) bool { return o == sb })
}

func (p *stormPool) pick(r *mrand.Rand) *stormSandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.live) == 0 {
		return nil
	}
	return p.live[r.IntN(len(p.live))]
}

func (p *stormPool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.live)
}

func (p *stormPool) all() []*stormSandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.live)
}

// stormKind is what one kind of request got: answers by status, and
// latencies.
type stormKind struct {
	codes map[string]int
	took  []time.Duration
}

type stormStats struct {
	mu       sync.Mutex
	kinds    map[string]*stormKind
	problems []string
}

func (st *stormStats) problem(format string, args ...any) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.problems = append(st.problems, fmt.Sprintf(format, args...))
}

// record counts one request of a kind on a sandbox: its status (0: no
// answer) with the error code of a refusal, and how long it took; what is
// wrong with it becomes a problem.
func (st *stormStats) record(kind string, sb *stormSandbox, status int, errCode string, took time.Duration, err error) {
	label := strconv.Itoa(status)
	if errCode != "" {
		label += " " + errCode
	}
	if status == 0 {
		label = "no answer"
	}
	st.mu.Lock()
	k := st.kinds[kind]
	if k == nil {
		k = &stormKind{codes: map[string]int{}}
		st.kinds[kind] = k
	}
	k.codes[label]++
	k.took = append(k.took, took)
	st.mu.Unlock()
	// Which sandbox and when, as logsOf reads it back.
	on := "on - at " + time.Now().Add(-took).UTC().Format(stormClock)
	if sb != nil {
		on = "on " + sb.id + " at " + time.Now().Add(-took).UTC().Format(stormClock)
	}
	switch {
	case took > stormBound:
		st.problem("stuck: %s %s took %s (%s %v)", kind, on, took.Round(time.Millisecond), label, err)
	case status == 0 || status >= 500:
		st.problem("%s %s: %s after %s: %v", kind, on, label, took.Round(time.Millisecond), err)
	case status >= 400 && status != http.StatusNotFound && status != http.StatusConflict && status != http.StatusGone:
		// 409 capacity would be fine too, but the node lends twice what
		// the pool holds: none comes.
		st.problem("%s %s: %s: %v", kind, on, label, err)
	case errors.Is(err, errCutAnswer) && sb != nil && sb.cutByDelete():
		// The sandbox was deleted under the answer: its connection is cut
		// (the client sees the break, never a short body taken as whole).
		st.mu.Lock()
		k.codes[label]--
		k.codes[label+" cut by delete"]++
		st.mu.Unlock()
	case err != nil && status < 300:
		st.problem("%s %s: a wrong answer (%s): %v", kind, on, label, err)
	}
}

// stormClock is how problems and the daemon's log say when.
const stormClock = "15:04:05.000"

// stormWorker sends one worker's requests.
type stormWorker struct {
	s *storm
	n int
	r *mrand.Rand
}

func (s *storm) worker(n int) *stormWorker {
	return &stormWorker{s: s, n: n, r: mrand.New(mrand.NewPCG(uint64(n), uint64(time.Now().UnixNano())))}
}

// call sends one API request and records it under kind. body is JSON (or
// raw bytes); a 2xx answer is decoded into out (a *[]byte takes it raw)
// and then checked by check. A refusal's error code goes to the tally.
func (w *stormWorker) call(kind string, sb *stormSandbox, method, path string, body, out any, check func() error) bool {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stormBound+15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, "http://"+w.s.d.addr+path, rd)
	req.Header.Set("Authorization", "Bearer "+w.s.d.key)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	status, errCode, err := w.do(w.s.api, req, out)
	if err == nil && status < 300 && check != nil {
		err = check()
	}
	w.s.stats.record(kind, sb, status, errCode, time.Since(start), err)
	return err == nil && status < 300
}

// do sends req and reads its answer: the status, a refusal's error code,
// and an error when there was no answer or a 2xx could not be decoded.
func (w *stormWorker) do(c *http.Client, req *http.Request, out any) (int, string, error) {
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", fmt.Errorf("%w: reading it: %w", errCutAnswer, err)
	}
	if resp.StatusCode >= 300 {
		var eb wire.ErrorBody
		if json.Unmarshal(data, &eb) != nil {
			return resp.StatusCode, "", fmt.Errorf("%.200s", data)
		}
		code := string(eb.Error.Code)
		if eb.Error.Reason != "" {
			code += "/" + eb.Error.Reason
		}
		return resp.StatusCode, code, errors.New(eb.Error.Message)
	}
	switch o := out.(type) {
	case nil:
	case *[]byte:
		*o = data
	default:
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, "", fmt.Errorf("decoding %.200s: %w", data, err)
		}
	}
	return resp.StatusCode, "", nil
}

func sandboxPath(sb *stormSandbox, tail string) string {
	return "/v1/sandboxes/" + sb.id + tail
}

// create makes one sandbox of the pool; every second one serves HTTP and
// every third one has an idle policy.
func (w *stormWorker) create() *stormSandbox {
	n := w.s.serial.Add(1)
	sb := &stormSandbox{web: n%2 == 0, idle: n%3 == 0}
	req := torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{MemoryMiB: stormMemoryMiB, DiskMiB: stormDiskMiB},
		Metadata: map[string]string{"storm": strconv.FormatInt(n, 10)}}
	if sb.web {
		req.Runtime.Setup = []string{"mkdir -p /www && echo hi > /www/index.html"}
		req.Runtime.Entrypoint = []string{"httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"}
	}
	if sb.idle {
		req.LifecyclePolicy = &torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(3)}
	}
	var got torpor.Sandbox
	if !w.call("create", nil, "POST", "/v1/sandboxes", req, &got, func() error {
		if got.State != torpor.StateRunning || got.TrafficToken == "" {
			return fmt.Errorf("created %s %s", got.ID, got.State)
		}
		return nil
	}) {
		return nil
	}
	sb.id, sb.token = got.ID, got.TrafficToken
	w.s.pool.add(sb)
	return sb
}

// stormOp is one kind of random operation on a sandbox of the pool; it
// may send more than one request.
type stormOp struct {
	name   string
	weight int
	run    func(w *stormWorker, sb *stormSandbox)
}

var stormOps = []stormOp{
	{"get", 4, func(w *stormWorker, sb *stormSandbox) {
		var got torpor.Sandbox
		w.call("get", sb, "GET", sandboxPath(sb, ""), nil, &got, func() error {
			if got.ID != sb.id {
				return fmt.Errorf("got %q", got.ID)
			}
			return nil
		})
	}},
	{"exec", 10, func(w *stormWorker, sb *stormSandbox) {
		word := "w" + strconv.Itoa(w.r.IntN(1e6))
		var res wire.ExecResponse
		w.call("exec", sb, "POST", sandboxPath(sb, "/exec"), wire.ExecRequest{Cmd: []string{"echo", word}}, &res, func() error {
			if res.ExitCode != 0 || res.Stdout != word+"\n" {
				return fmt.Errorf("echo %s: %+v", word, res)
			}
			return nil
		})
	}},
	{"files", 8, func(w *stormWorker, sb *stormSandbox) {
		p := fmt.Sprintf("/root/storm/w%d-%d", w.n, w.r.IntN(1e9))
		data := []byte(p + strings.Repeat(".", w.r.IntN(4096)))
		q := "?path=" + url.QueryEscape(p)
		if !w.call("file_write", sb, "PUT", sandboxPath(sb, "/files"+q), data, nil, nil) {
			return
		}
		var got []byte
		w.call("file_read", sb, "GET", sandboxPath(sb, "/files"+q), nil, &got, func() error {
			if !bytes.Equal(got, data) {
				return fmt.Errorf("read %d bytes of %s, wrote %d", len(got), p, len(data))
			}
			return nil
		})
		var l struct{ Entries []struct{ Path string } }
		w.call("file_list", sb, "GET", sandboxPath(sb, "/files/list?path=/root/storm"), nil, &l, func() error {
			if !slices.ContainsFunc(l.Entries, func(e struct{ Path string }) bool { return e.Path == p }) {
				return fmt.Errorf("the listing of /root/storm lacks %s", p)
			}
			return nil
		})
	}},
	{"tar", 1, func(w *stormWorker, sb *stormSandbox) {
		var got []byte
		w.call("tar_get", sb, "GET", sandboxPath(sb, "/files/tar?path=/etc"), nil, &got, func() error {
			tr := tar.NewReader(bytes.NewReader(got))
			for {
				h, err := tr.Next()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return fmt.Errorf("the archive of /etc: %w", err)
				}
				if _, err := io.Copy(io.Discard, tr); err != nil {
					return fmt.Errorf("the archive's %s: %w", h.Name, err)
				}
			}
		})
	}},
	{"proxy", 8, func(w *stormWorker, sb *stormSandbox) {
		if !sb.web {
			w.call("touch", sb, "POST", sandboxPath(sb, "/touch"), nil, nil, nil)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), stormBound+15*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+w.s.d.proxy+"/index.html", nil)
		req.Host = "8080-" + sb.id + ".localhost"
		req.Header.Set("X-Torpor-Token", sb.token)
		var got []byte
		start := time.Now()
		status, code, err := w.do(w.s.proxy, req, &got)
		if err == nil && status == 200 && string(got) != "hi\n" {
			err = fmt.Errorf("the page reads %q", got)
		}
		w.s.stats.record("proxy_get", sb, status, code, time.Since(start), err)
	}},
	{"pause", 5, func(w *stormWorker, sb *stormSandbox) {
		w.call("pause", sb, "POST", sandboxPath(sb, "/pause"), wire.PauseRequest{Mode: torpor.PauseFreeze}, nil, nil)
	}},
	{"start", 5, func(w *stormWorker, sb *stormSandbox) {
		w.call("start", sb, "POST", sandboxPath(sb, "/start"), nil, nil, nil)
	}},
	{"hibernate", 2, func(w *stormWorker, sb *stormSandbox) {
		w.call("hibernate", sb, "POST", sandboxPath(sb, "/hibernate"), nil, nil, nil)
	}},
	{"restart", 2, func(w *stormWorker, sb *stormSandbox) {
		w.call("restart", sb, "POST", sandboxPath(sb, "/restart"), nil, nil, nil)
	}},
	{"touch", 3, func(w *stormWorker, sb *stormSandbox) {
		w.call("touch", sb, "POST", sandboxPath(sb, "/touch"), nil, nil, nil)
	}},
	{"process", 3, func(w *stormWorker, sb *stormSandbox) {
		var p wire.Process
		if !w.call("process_spawn", sb, "POST", sandboxPath(sb, "/processes"), wire.ProcessRequest{Cmd: []string{"sleep", "60"}}, &p, nil) {
			return
		}
		w.call("process_kill", sb, "POST", sandboxPath(sb, "/processes/"+strconv.Itoa(p.ID)+"/signal"), wire.SignalRequest{Signal: "KILL"}, nil, nil)
	}},
	{"code", 2, func(w *stormWorker, sb *stormSandbox) {
		var res wire.CodeResponse
		w.call("run_code", sb, "POST", sandboxPath(sb, "/code"), wire.CodeRequest{Language: "sh", Code: "echo $((6*7))"}, &res, func() error {
			if res.Stdout != "42\n" {
				return fmt.Errorf("run_code: %+v", res)
			}
			return nil
		})
	}},
	{"delete", 2, func(w *stormWorker, sb *stormSandbox) {
		sb.deleting.CompareAndSwap(0, time.Now().UnixNano())
		if w.call("delete", sb, "DELETE", sandboxPath(sb, ""), nil, nil, nil) {
			w.s.pool.remove(sb)
		}
	}},
	{"create", 0, nil}, // when the pool is short
}

// pickOp draws an operation by weight.
func (w *stormWorker) pickOp() stormOp {
	total := 0
	for _, op := range stormOps {
		total += op.weight
	}
	n := w.r.IntN(total)
	for _, op := range stormOps {
		if n -= op.weight; n < 0 {
			return op
		}
	}
	panic("unreachable")
}

// populate creates n sandboxes with as many workers as cores, and
// returns them.
func (s *storm) populate(n int) []*stormSandbox {
	var (
		mu   sync.Mutex
		made []*stormSandbox
		wg   sync.WaitGroup
		left atomic.Int64
	)
	left.Store(int64(n))
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := s.worker(1000 + i)
			for left.Add(-1) >= 0 {
				if sb := w.create(); sb != nil {
					mu.Lock()
					made = append(made, sb)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	s.failOnProblems("creating the pool")
	return made
}

// storm runs workers for a while; a worker creates a sandbox when the
// pool is short of sandboxes.
func (s *storm) storm(workers, sandboxes int, d time.Duration) {
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := s.worker(i)
			for time.Now().Before(end) {
				if s.pool.size() < sandboxes && w.r.IntN(2) == 0 {
					w.create()
					continue
				}
				if sb := s.pool.pick(w.r); sb != nil {
					w.pickOp().run(w, sb)
				}
			}
		}()
	}
	wg.Wait()
}

// deleteAll deletes sandboxes, eight at a time.
func (s *storm) deleteAll(sbs []*stormSandbox) {
	s.each(sbs, 2000, func(w *stormWorker, sb *stormSandbox) {
		sb.deleting.CompareAndSwap(0, time.Now().UnixNano())
		if !w.call("delete", sb, "DELETE", sandboxPath(sb, ""), nil, nil, nil) {
			s.stats.problem("the final delete of %s failed", sb.id)
		}
		s.pool.remove(sb)
	})
}

// each runs fn on each of sbs, eight at a time, with workers of their
// own (numbered from base).
func (s *storm) each(sbs []*stormSandbox, base int, fn func(w *stormWorker, sb *stormSandbox)) {
	ch := make(chan *stormSandbox)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := s.worker(base + i)
			for sb := range ch {
				fn(w, sb)
			}
		}()
	}
	for _, sb := range sbs {
		ch <- sb
	}
	close(ch)
	wg.Wait()
}

// failOnProblems ends the test with what went wrong so far.
func (s *storm) failOnProblems(during string) {
	s.t.Helper()
	s.stats.mu.Lock()
	defer s.stats.mu.Unlock()
	if p := s.stats.problems; len(p) > 0 {
		s.t.Logf("%s", s.table())
		s.t.Fatalf("%d problems during %s, among them:\n%s\n%s", len(p), during,
			strings.Join(p[:min(len(p), 30)], "\n"), s.logsOf(p[:min(len(p), 3)]))
	}
}

// logsOf returns, for each problem that names a sandbox ("on ID at
// 15:04:05.000", or "sandbox ID"), the daemon's log lines about it: from
// a few seconds before to a few after the time, or the last ones; else
// the log's last lines.
func (s *storm) logsOf(problems []string) string {
	lines := strings.Split(s.d.logs.String(), "\n")
	var b strings.Builder
	for _, p := range problems {
		var id, clock string
		if _, rest, ok := strings.Cut(p, " on "); ok {
			fmt.Sscanf(rest, "%s at %s", &id, &clock)
		} else if _, rest, ok := strings.Cut(p, "sandbox "); ok {
			fmt.Sscanf(rest, "%s", &id)
		}
		if !torpor.ValidID(id) || len(id) != 20 {
			continue
		}
		at, err := time.Parse(stormClock, strings.TrimRight(clock, ":"))
		var of []string
		for _, l := range lines {
			_, ts, ok := strings.Cut(l, "time=")
			if !ok || !strings.Contains(l, id) || len(ts) < 24 {
				continue
			}
			if t, terr := time.Parse(stormClock, ts[11:23]); err != nil || terr == nil && t.After(at.Add(-3*time.Second)) && t.Before(at.Add(5*time.Second)) {
				of = append(of, l)
			}
		}
		fmt.Fprintf(&b, "daemon log of %s around %s:\n%s\n", id, clock, strings.Join(of[max(0, len(of)-40):], "\n"))
	}
	if b.Len() == 0 {
		fmt.Fprintf(&b, "daemon log (last lines):\n%s", strings.Join(lines[max(0, len(lines)-60):], "\n"))
	}
	return b.String()
}

// checkSandboxes checks, once the storm is over, that every sandbox of
// the pool is in a state at rest (not failed, not between two states),
// that those running answer a command and, for web ones, a proxied
// request, and that the host holds what their states say.
func (s *storm) checkSandboxes() {
	t := s.t
	var list []*torpor.Sandbox
	w := s.worker(3000)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got struct{ Sandboxes []*torpor.Sandbox }
		if !w.call("list", nil, "GET", "/v1/sandboxes", nil, &got, nil) {
			s.failOnProblems("listing the sandboxes")
		}
		list = got.Sandboxes
		moving := 0
		for _, sb := range list {
			if sb.State.Transitional() {
				moving++
			}
		}
		if moving == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	byState := map[torpor.State]int{}
	for _, sb := range list {
		byState[sb.State]++
		switch sb.State {
		case torpor.StateRunning, torpor.StatePaused, torpor.StateHibernated:
		default:
			s.stats.problem("sandbox %s ended the storm %s (%+v)", sb.ID, sb.State, sb.Failure)
		}
	}
	t.Logf("after the storm: %d sandboxes %v", len(list), byState)
	if len(list) != s.pool.size() {
		s.stats.problem("the daemon lists %d sandboxes, the storm holds %d", len(list), s.pool.size())
	}
	s.failOnProblems("the check of states")
	rig := &crashRig{t: t, kind: "runc", dataDir: s.d.dataDir, tally: map[string]int{}}
	rig.checkHost(t, s.d)
	if t.Failed() {
		t.FailNow()
	}
	// Every sandbox still works: a command, and the page of web ones
	// (both wake a paused or hibernated one).
	s.each(s.pool.all(), 3000, func(w *stormWorker, sb *stormSandbox) {
		for _, op := range stormOps {
			if op.name == "exec" || (op.name == "proxy" && sb.web) {
				op.run(w, sb)
			}
		}
	})
	s.failOnProblems("the check that every sandbox works")
}

// stormFigures is what the daemon holds: open descriptors, goroutines,
// resident memory, threads.
type stormFigures struct {
	fds, goroutines, threads int
	rssKiB                   int64
	heapMiB                  float64
	// goMiB is what the Go runtime holds of the OS's memory (obtained and
	// not released): the rest of the RSS is the store's (SQLite's page
	// caches, allocated outside the Go heap) and the binary's.
	goMiB float64
	took  time.Duration // to come back to the baseline
}

func (f stormFigures) String() string {
	return fmt.Sprintf("%d fds, %d goroutines, %d threads, RSS %.1f MiB (Go runtime %.1f MiB, heap in use %.1f MiB)",
		f.fds, f.goroutines, f.threads, float64(f.rssKiB)/1024, f.goMiB, f.heapMiB)
}

// figures measures the daemon: descriptors and memory from /proc, the Go
// runtime's figures from /metrics (scraped on a connection of its own,
// closed after it).
func (s *storm) figures() stormFigures {
	pid := s.d.cmd.Process.Pid
	var f stormFigures
	fds, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	f.fds = len(fds)
	f.rssKiB = vmRSS(nil, pid)
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			f.threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	req, _ := http.NewRequest("GET", "http://"+s.d.addr+"/metrics", nil)
	req.Close = true
	req.Header.Set("Authorization", "Bearer "+s.d.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var sys, released float64
	for _, line := range strings.Split(string(body), "\n") {
		name, v, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseFloat(v, 64)
		switch name {
		case "go_goroutines":
			f.goroutines = int(n)
		case "go_memstats_heap_inuse_bytes":
			f.heapMiB = n / (1 << 20)
		case "go_memstats_sys_bytes":
			sys = n
		case "go_memstats_heap_released_bytes":
			released = n
		}
	}
	f.goMiB = (sys - released) / (1 << 20)
	return f
}

// settle closes the storm's idle connections and measures the daemon
// once its descriptors and goroutines stop falling (or, given a
// baseline, once they are back within the margins of it), for at most
// stormSettle.
func (s *storm) settle(base *stormFigures) stormFigures {
	start := time.Now()
	var last stormFigures
	for {
		s.api.CloseIdleConnections()
		s.proxy.CloseIdleConnections()
		time.Sleep(time.Second)
		f := s.figures()
		f.took = time.Since(start)
		switch {
		case base != nil && f.fds <= base.fds+stormFDMargin && f.goroutines <= base.goroutines+stormGoroutineMargin:
			return f
		case base == nil && last.fds == f.fds && last.goroutines == f.goroutines:
			return f
		case time.Since(start) > stormSettle:
			return f
		}
		last = f
	}
}

// summary logs the requests by kind and answer with their latencies, the
// pool's peak, and the daemon's figures before and after.
func (s *storm) summary(base stormFigures, after []stormFigures) {
	s.stats.mu.Lock()
	table := s.table()
	s.stats.mu.Unlock()
	var rounds strings.Builder
	for i, f := range after {
		fmt.Fprintf(&rounds, "\ndaemon after round %d: %s (settled in %s)", i+1, f, f.took.Round(time.Second))
	}
	s.t.Logf("storm summary\n%s\npeak live sandboxes %d, created %d in all; the host at its fullest: %d tasks, %d MiB available\n"+
		"daemon before:        %s%s", table, s.pool.peak, s.pool.made, s.peakTasks, s.leastAvailMiB, base, rounds.String())
}

// table formats the requests by kind: count, answers, p50 and p99 (the
// caller holds the stats' lock).
func (s *storm) table() string {
	var kinds []string
	total := 0
	for k, v := range s.stats.kinds {
		kinds = append(kinds, k)
		total += len(v.took)
	}
	sort.Strings(kinds)
	var b strings.Builder
	fmt.Fprintf(&b, "%-14s %7s %9s %9s %9s  %s\n", "kind", "n", "p50", "p99", "max", "answers")
	for _, k := range kinds {
		v := s.stats.kinds[k]
		took := slices.Clone(v.took)
		slices.Sort(took)
		var codes []string
		for c, n := range v.codes {
			codes = append(codes, fmt.Sprintf("%s: %d", c, n))
		}
		sort.Strings(codes)
		q := func(p float64) string { return took[int(p*float64(len(took)-1))].Round(time.Millisecond).String() }
		fmt.Fprintf(&b, "%-14s %7d %9s %9s %9s  %s\n", k, len(took), q(0.5), q(0.99), q(1), strings.Join(codes, ", "))
	}
	fmt.Fprintf(&b, "%-14s %7d", "all", total)
	return b.String()
}

// TestDiskImageMountedOnce: a sandbox's disk image is mounted through one
// loop device, whatever keeps the file system of an earlier instance alive
// after its unmount: a files call that holds the root open across a
// restart (a download the client reads slowly, past the drain timeout), or
// a process on the host that unshared its mounts while the sandbox ran
// and so holds a copy of them across a hibernation. The next boot mounts
// that same file system again, at once; a second one mounted from the
// image beside it would corrupt the image (the storm found "structure
// needs cleaning" that way), and e2fsck finds the image whole.
func TestDiskImageMountedOnce(t *testing.T) {
	needs(t)
	fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		t.Skip("needs e2fsck (apt-get install e2fsprogs)")
	}
	d := startDaemon(t, torporBin(t), t.TempDir())
	cl := d.client(t)
	ctx := context.Background()
	id := strings.TrimSpace(d.ok("create", "--disk", "128"))
	image := filepath.Join(d.dataDir, "runc", "sandboxes", id, "disk.img")
	if _, err := os.Stat(image); err != nil {
		t.Skip("the sandbox has no disk image (the host cannot make them)")
	}
	loops := func() int {
		n := 0
		files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == image {
				n++
			}
		}
		return n
	}
	whole := func(what string) {
		t.Helper()
		d.ok("hibernate", id)
		// e2fsck reads a file system still mounted somewhere as damaged:
		// wait for the last mount of it (a namespace of a process just
		// killed is torn down after it is reaped) to let the image go.
		for deadline := time.Now().Add(30 * time.Second); loops() > 0; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the disk image is still bound to a loop device 30 s after the hibernation", what)
			}
		}
		if out, err := exec.Command(fsck, "-fn", image).CombinedOutput(); err != nil {
			t.Fatalf("%s: the disk image is damaged: %v\n%s", what, err, out)
		}
		d.ok("start", id)
	}

	d.ok("exec", id, "--", "sh", "-c", "head -c 60000000 /dev/zero > /root/big")
	rc, err := cl.ReadFile(ctx, id, "/root/big")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	restarted := make(chan error, 1)
	go func() { _, err := cl.Restart(ctx, id); restarted <- err }()
	select {
	case err := <-restarted:
		if err != nil {
			t.Fatalf("restart under a download: %v", err)
		}
	case <-time.After(lifecycle.DefaultDrainTimeout + 10*time.Second):
		t.Fatal("the restart waited for the download")
	}
	if n := loops(); n != 1 {
		t.Fatalf("%d loop devices hold the image after a restart under a download, want 1", n)
	}
	d.ok("exec", id, "--", "sh", "-c", "for i in $(seq 200); do echo $i > /root/f$i; done; sync")
	if n, err := io.Copy(io.Discard, rc); err != nil || n != 60000000-64<<10 {
		t.Fatalf("the download across the restart: %d bytes, %v", n, err)
	}
	rc.Close()
	whole("after a restart under a download")

	if _, err := exec.LookPath("unshare"); err == nil {
		holder := exec.Command("unshare", "-m", "--propagation", "private", "sleep", "60")
		if err := holder.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { holder.Process.Kill(); holder.Wait() }()
		time.Sleep(300 * time.Millisecond) // its namespace is made
		d.ok("hibernate", id)
		d.ok("start", id)
		if n := loops(); n != 1 {
			t.Fatalf("%d loop devices hold the image after a start while a copy of its old mount lives, want 1", n)
		}
		d.ok("exec", id, "--", "sh", "-c", "rm /root/big; for i in $(seq 200); do echo $i > /root/g$i; done; sync")
		holder.Process.Kill()
		holder.Wait()
		whole("after a start while a copy of the old mount lived")
	}
	if out := d.ok("exec", id, "--", "sh", "-c", "cat /root/f200 /root/g200 2>/dev/null || cat /root/f200"); !strings.HasPrefix(out, "200\n") {
		t.Fatalf("files written after the restarts read %q", out)
	}
}
