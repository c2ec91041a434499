package main

// Idle-connection mode: open many MQTT sessions and hold them so the runner
// can read the broker's resident memory per connection. With -subscribe each
// one subscribes to a topic of its own first, and the time from the first
// CONNECT to the last SUBACK gives the connect rate.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type idleResult struct {
	Mode       string  `json:"mode"`
	Connected  int     `json:"connected"`
	Failed     int     `json:"failed"`
	Subscribed bool    `json:"subscribed"`
	ConnectS   float64 `json:"connect_s"`
	Error      string  `json:"error,omitempty"`
}

func retryable(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, os.ErrDeadlineExceeded)
}

// openMany opens `conns` connections, `concurrency` connecting at once, each retried a few times on the
// errors a loaded broker gives (reset, refused, timeout): setup gets each one after its CONNACK (i is its
// index) and may close it by returning an error. It returns the connections kept (nil where one failed),
// how many failed, the first error and how long it all took.
func openMany(cfg *config, conns, concurrency int, name string, setup func(i int, c net.Conn, r *bufio.Reader) error) ([]net.Conn, int, string, float64) {
	start := time.Now()
	held := make([]net.Conn, conns)
	var failed atomic.Int64
	var firstErr atomic.Value
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				var err error
				for attempt := 0; attempt < 5; attempt++ {
					var c net.Conn
					var r *bufio.Reader
					c, r, err = dial(cfg, fmt.Sprintf("bench-%s-%s-%d", cfg.runID, name, i), 300)
					if err == nil && setup != nil {
						if err = setup(i, c, r); err != nil {
							_ = c.Close()
						}
					}
					if err == nil {
						held[i] = c
						break
					}
					if !retryable(err) {
						break
					}
					time.Sleep(time.Duration(50*(attempt+1)) * time.Millisecond)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	for i := 0; i < conns; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	first := ""
	if v := firstErr.Load(); v != nil {
		first = fmt.Sprintf("%d connections failed, first: %s", failed.Load(), v.(string))
	}
	return held, int(failed.Load()), first, time.Since(start).Seconds()
}

// closeAll says DISCONNECT on every connection kept and closes it.
func closeAll(held []net.Conn) {
	for _, c := range held {
		if c != nil {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write(disconnectPkt)
			_ = c.Close()
		}
	}
}

func runIdle(cfg *config, conns, concurrency int, subscribeEach bool, hold time.Duration, asJSON bool) int {
	var setup func(int, net.Conn, *bufio.Reader) error
	if subscribeEach {
		setup = func(i int, c net.Conn, r *bufio.Reader) error {
			return subscribe(c, r, fmt.Sprintf("bench/%s/idle/%d", cfg.runID, i), 1)
		}
	}
	held, failed, firstErr, connectS := openMany(cfg, conns, concurrency, "idle", setup)
	res := idleResult{Mode: "idle", Failed: failed, Subscribed: subscribeEach, ConnectS: connectS, Error: firstErr}
	res.Connected = conns - res.Failed
	emit(res, asJSON)
	// Hold until stdin closes (the runner is done measuring) or hold expires.
	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	select {
	case <-stdinClosed:
	case <-time.After(hold):
	}
	closeAll(held)
	if res.Error != "" {
		return 1
	}
	return 0
}

func emit(v any, asJSON bool) {
	if asJSON {
		b, _ := json.Marshal(v)
		fmt.Fprintln(os.Stdout, string(b))
		return
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Fprintln(os.Stdout, string(b))
}
