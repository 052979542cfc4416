package lifecycle

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// scheduler holds one deadline per sandbox in a min-heap and keeps a single
// clock timer armed for the earliest one, so that 100,000 idle sandboxes
// cost one sleeping timer, not a scan. When deadlines pass it hands their
// ids to fire, a few at a time.
type scheduler struct {
	clock torpor.Clock
	fire  func(ctx context.Context, id string)

	mu      sync.Mutex
	h       deadlineHeap
	byID    map[string]*deadline
	timer   torpor.Timer
	timerAt time.Time

	wake chan struct{}
	work chan string
}

type deadline struct {
	id    string
	at    time.Time
	index int
}

type deadlineHeap []*deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *deadlineHeap) Push(x any) {
	d := x.(*deadline)
	d.index = len(*h)
	*h = append(*h, d)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	d.index = -1
	return d
}

// sweepWorkers bounds how many due sandboxes are acted on at once.
const sweepWorkers = 8

func newScheduler(clock torpor.Clock, fire func(ctx context.Context, id string)) *scheduler {
	return &scheduler{
		clock: clock,
		fire:  fire,
		byID:  map[string]*deadline{},
		wake:  make(chan struct{}, 1),
		work:  make(chan string, 1024),
	}
}

// run dispatches due sandboxes until ctx ends.
func (s *scheduler) run(ctx context.Context, wg *sync.WaitGroup) {
	for range sweepWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case id := <-s.work:
					s.fire(ctx, id)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				s.mu.Lock()
				if s.timer != nil {
					s.timer.Stop()
				}
				s.mu.Unlock()
				return
			case <-s.wake:
			}
			for _, id := range s.due() {
				select {
				case s.work <- id:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
}

// set makes at the deadline of id, replacing any earlier one.
func (s *scheduler) set(id string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.byID[id]; ok {
		d.at = at
		heap.Fix(&s.h, d.index)
	} else {
		d := &deadline{id: id, at: at}
		heap.Push(&s.h, d)
		s.byID[id] = d
	}
	s.armLocked()
}

// remove drops id's deadline.
func (s *scheduler) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.byID[id]; ok {
		heap.Remove(&s.h, d.index)
		delete(s.byID, id)
		s.armLocked()
	}
}

// next returns id's deadline.
func (s *scheduler) next(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.byID[id]; ok {
		return d.at, true
	}
	return time.Time{}, false
}

// len returns how many deadlines are held.
func (s *scheduler) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.h)
}

// due pops every deadline that has passed and re-arms the timer.
func (s *scheduler) due() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var ids []string
	for len(s.h) > 0 && !s.h[0].at.After(now) {
		d := heap.Pop(&s.h).(*deadline)
		delete(s.byID, d.id)
		ids = append(ids, d.id)
	}
	s.timerAt = time.Time{}
	s.armLocked()
	return ids
}

// armLocked points the one timer at the earliest deadline.
func (s *scheduler) armLocked() {
	if len(s.h) == 0 {
		return
	}
	at := s.h[0].at
	if s.timer != nil && !s.timerAt.IsZero() && !at.Before(s.timerAt) {
		return // the armed timer fires first anyway; due() re-arms
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timerAt = at
	s.timer = s.clock.AfterFunc(at.Sub(s.clock.Now()), func() {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	})
}
