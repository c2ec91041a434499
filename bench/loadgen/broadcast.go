package main

// Broadcast mode (issue 30): -conns connections all subscribe to one topic, then one more connection
// publishes -messages messages to it, so that each message goes to every one of them. The broker's CPU
// (-cpu-pids) from the first PUBLISH to the last delivery, over the deliveries counted, is what one
// broadcast delivery costs it at that many connections.

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

type broadcastResult struct {
	Mode        string             `json:"mode"`
	Subscribers int                `json:"subscribers"`
	Failed      int                `json:"failed"`
	Messages    int                `json:"messages"`
	QoS         int                `json:"qos"`
	Deliveries  int64              `json:"deliveries"`
	Expected    int64              `json:"expected"`
	ConnectS    float64            `json:"connect_s"`
	ElapsedS    float64            `json:"elapsed_s"`
	CPU         map[string]float64 `json:"cpu_s,omitempty"`
	Error       string             `json:"error,omitempty"`
}

// readerBufSize: what each subscriber reads through (18,000 of them; the 64 KiB of the flows' readers
// would take a gigabyte here).
const readerBufSize = 4 << 10

func runBroadcast(cfg *config, conns, concurrency, messages int, pids map[string]int, drain time.Duration) broadcastResult {
	topic := fmt.Sprintf("bench/%s/broadcast", cfg.runID)
	res := broadcastResult{Mode: "broadcast", Messages: messages, QoS: cfg.qos}
	var got atomic.Int64
	var all sync.WaitGroup // one per subscriber: done when it has every message
	all.Add(conns)
	readers := make([]*bufio.Reader, conns)
	held, failed, firstErr, connectS := openMany(cfg, conns, concurrency, "broadcast",
		func(i int, c net.Conn, r *bufio.Reader) error {
			if err := subscribe(c, r, topic, byte(cfg.qos)); err != nil {
				return err
			}
			if r.Buffered() != 0 {
				return fmt.Errorf("subscriber %d: unexpected bytes after SUBACK", i)
			}
			readers[i] = bufio.NewReaderSize(c, readerBufSize)
			return nil
		})
	res.Failed, res.Error, res.ConnectS = failed, firstErr, connectS
	res.Subscribers = conns - failed
	defer closeAll(held)
	for i, c := range held {
		if c == nil {
			all.Done()
			continue
		}
		go broadcastReader(c, readers[i], messages, &got, &all)
	}
	if res.Error != "" {
		return res
	}
	pub, _, err := dial(cfg, fmt.Sprintf("bench-%s-broadcaster", cfg.runID), 300)
	if err != nil {
		res.Error = "publisher: " + err.Error()
		return res
	}
	defer pub.Close()
	go discard(pub) // (its PUBACKs)
	time.Sleep(time.Second)
	res.Expected = int64(res.Subscribers) * int64(messages)
	before := sampleCPU(pids)
	start := time.Now()
	w := bufio.NewWriter(pub)
	pkt, pidOff, _ := encodePublish(topic, byte(cfg.qos), cfg.payload)
	for m := 0; m < messages; m++ {
		if pidOff >= 0 {
			pkt[pidOff], pkt[pidOff+1] = byte((m+1)>>8), byte(m+1)
		}
		if _, err := w.Write(pkt); err != nil {
			res.Error = "publish: " + err.Error()
			return res
		}
	}
	if err := w.Flush(); err != nil {
		res.Error = "publish: " + err.Error()
		return res
	}
	done := make(chan struct{})
	go func() { all.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drain):
	}
	res.ElapsedS = time.Since(start).Seconds()
	after := sampleCPU(pids)
	res.Deliveries = got.Load()
	if len(pids) > 0 {
		res.CPU = map[string]float64{}
		for name, v := range after {
			res.CPU[name] = v - before[name]
		}
	}
	if res.Deliveries < res.Expected {
		res.Error = fmt.Sprintf("%d of %d deliveries within %s", res.Deliveries, res.Expected, drain)
	}
	return res
}

// broadcastReader counts the PUBLISH packets of one subscriber (acking QoS 1), done at `messages`.
func broadcastReader(c net.Conn, r *bufio.Reader, messages int, got *atomic.Int64, all *sync.WaitGroup) {
	n := 0
	var scratch []byte
	var ack []byte
	for {
		p, err := readPacket(r, &scratch)
		if err != nil {
			if n < messages {
				all.Done()
			}
			return
		}
		if p.typ() == pktPublish {
			if (p.header>>1)&3 == 1 {
				pid, _, err := parsePublish(p)
				if err == nil {
					ack = appendAck(ack[:0], pktPuback, pid)
					_, _ = c.Write(ack)
				}
			}
			got.Add(1)
			n++
			if n == messages {
				all.Done()
			}
		}
		_, _ = r.Discard(p.size)
	}
}

func discard(c net.Conn) {
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}
