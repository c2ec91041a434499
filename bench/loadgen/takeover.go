package main

// Takeover latency across fleet nodes: a persistent session on node A
// (-port) has a full Inflight Window of unacked deliveries and `queued` more
// messages waiting; the same client id then connects to node B (-sub-port).
// Measured from writing CONNECT on B to reading CONNACK and to reading the
// first resent PUBLISH, and to the last message of the session being
// received on B. Every repetition uses a new client id and topic.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"time"
)

type takeoverResult struct {
	Mode       string  `json:"mode"`
	QoS        int     `json:"qos"`
	Reps       int     `json:"reps"`
	WarmupReps int     `json:"warmup_reps"`
	Queued     int     `json:"queued"`
	Inflight   int     `json:"inflight"`
	ConnackP50 float64 `json:"connack_p50_ms"`
	ConnackP99 float64 `json:"connack_p99_ms"`
	FirstP50   float64 `json:"first_p50_ms"`
	FirstP99   float64 `json:"first_p99_ms"`
	FirstMax   float64 `json:"first_max_ms"`
	DrainP50   float64 `json:"drain_p50_ms"`
	DrainP99   float64 `json:"drain_p99_ms"`
	Lost       int64   `json:"lost"`
	Dup        int64   `json:"dup"`
	OldOpen    int     `json:"old_not_closed"`
	CPUs       float64 `json:"loadgen_cpu_s"`
	Error      string  `json:"error,omitempty"`
}

type takeoverSample struct {
	connack, first, drain time.Duration
	lost, dup             int64
	oldOpen               bool
}

// quantileMs is the nearest-rank quantile of ds in milliseconds.
func quantileMs(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s))*q+0.999999) - 1
	i = max(0, min(len(s)-1, i))
	return float64(s[i]) / 1e6
}

func runTakeover(cfg *config, reps, warmupReps, queued, inflight int) takeoverResult {
	res := takeoverResult{Mode: "takeover", QoS: cfg.qos, Reps: reps, WarmupReps: warmupReps,
		Queued: queued, Inflight: inflight}
	if cfg.qos == 0 {
		res.Error = "takeover needs QoS 1 or 2"
		return res
	}
	if queued+inflight > 65535 {
		res.Error = "queued + inflight must fit in 65535 packet ids"
		return res
	}
	cpu0 := cpuSeconds()
	var connack, first, drain []time.Duration
	for i := 0; i < warmupReps+reps; i++ {
		smp, err := takeoverOnce(cfg, i, queued, inflight)
		if err != nil {
			res.Error = fmt.Sprintf("repetition %d: %v", i, err)
			break
		}
		if i < warmupReps {
			continue
		}
		connack = append(connack, smp.connack)
		first = append(first, smp.first)
		drain = append(drain, smp.drain)
		res.Lost += smp.lost
		res.Dup += smp.dup
		if smp.oldOpen {
			res.OldOpen++
		}
	}
	res.CPUs = cpuSeconds() - cpu0
	res.ConnackP50, res.ConnackP99 = quantileMs(connack, 0.5), quantileMs(connack, 0.99)
	res.FirstP50, res.FirstP99 = quantileMs(first, 0.5), quantileMs(first, 0.99)
	res.FirstMax = quantileMs(first, 1)
	res.DrainP50, res.DrainP99 = quantileMs(drain, 0.5), quantileMs(drain, 0.99)
	return res
}

// seqOf returns the sequence number in a bench payload.
func seqOf(pay []byte) (uint64, bool) {
	if len(pay) < payMin {
		return 0, false
	}
	return binary.LittleEndian.Uint64(pay[paySeq:]), true
}

func takeoverOnce(cfg *config, rep, queued, inflight int) (takeoverSample, error) {
	var smp takeoverSample
	addrA := net.JoinHostPort(cfg.host, fmt.Sprint(cfg.port))
	addrB := net.JoinHostPort(cfg.subHost, fmt.Sprint(cfg.subPort))
	cid := fmt.Sprintf("bench-%s-tk-%d", cfg.runID, rep)
	topic := fmt.Sprintf("bench/%s/tk/%d", cfg.runID, rep)
	total := queued + inflight
	qos := byte(cfg.qos)

	// 1. The persistent session on A, subscribed.
	old, oldR, _, err := dialAddr(addrA, cid, 60, false)
	if err != nil {
		return smp, fmt.Errorf("connect on A: %w", err)
	}
	defer old.Close()
	if err := subscribe(old, oldR, topic, qos); err != nil {
		return smp, fmt.Errorf("subscribe on A: %w", err)
	}

	// 2. A publisher on A sends `total` messages and waits for every
	// confirm: the broker then owns them all.
	pub, pubR, _, err := dialAddr(addrA, fmt.Sprintf("bench-%s-tkpub-%d", cfg.runID, rep), 60, true)
	if err != nil {
		return smp, fmt.Errorf("publisher connect: %w", err)
	}
	defer pub.Close()
	pkt, pidOff, payOff := encodePublish(topic, qos, cfg.payload)
	w := bufio.NewWriterSize(pub, ioBufSize)
	for s := 0; s < total; s++ {
		binary.BigEndian.PutUint16(pkt[pidOff:], uint16(s+1))
		binary.LittleEndian.PutUint64(pkt[payOff+paySeq:], uint64(s))
		binary.LittleEndian.PutUint64(pkt[payOff+payTS:], uint64(nowNs()))
		if _, err := w.Write(pkt); err != nil {
			return smp, fmt.Errorf("publish: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		return smp, fmt.Errorf("publish: %w", err)
	}
	if err := pubConfirms(pub, pubR, w, qos, total, 30*time.Second); err != nil {
		return smp, err
	}

	// 3. The session on A holds a full Inflight Window it never acks; the
	// rest is queued. Nothing beyond the window may arrive.
	got, err := readPublishes(old, oldR, inflight, 10*time.Second)
	if err != nil {
		return smp, fmt.Errorf("on A, waiting for the inflight window of %d: got %d: %w", inflight, got, err)
	}
	if extra, _ := readPublishes(old, oldR, 1, 100*time.Millisecond); extra > 0 {
		return smp, fmt.Errorf("on A: more than %d unacked deliveries (max_inflight not applied)", inflight)
	}

	// 4. Takeover on B: time CONNECT -> CONNACK -> first resend -> all received.
	conn, err := tcpDial(addrB)
	if err != nil {
		return smp, fmt.Errorf("connect on B: %w", err)
	}
	defer conn.Close()
	r := bufio.NewReaderSize(conn, ioBufSize)
	t0 := time.Now()
	if _, err := conn.Write(encodeConnect(cid, 60, false)); err != nil {
		return smp, fmt.Errorf("CONNECT on B: %w", err)
	}
	present, err := readConnack(conn, r, 10*time.Second)
	if err != nil {
		return smp, fmt.Errorf("on B: %w", err)
	}
	smp.connack = time.Since(t0)
	if !present {
		return smp, errors.New("on B: CONNACK without session present (the session on A was not taken over)")
	}
	seen := make([]bool, total)
	unique := 0
	bw := bufio.NewWriterSize(conn, ioBufSize)
	var scratch []byte
	deadline := time.Now().Add(30 * time.Second)
	_ = conn.SetReadDeadline(deadline)
	for unique < total {
		if r.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return smp, fmt.Errorf("on B: %w", err)
			}
		}
		p, err := readPacket(r, &scratch)
		if err != nil {
			smp.lost = int64(total - unique)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return smp, fmt.Errorf("on B: %d of %d messages received after 30 s (%d duplicates)", unique, total, smp.dup)
			}
			return smp, fmt.Errorf("on B after %d of %d messages: %w", unique, total, err)
		}
		switch p.typ() {
		case pktPublish:
			if smp.first == 0 {
				smp.first = time.Since(t0)
				if p.header&0x08 == 0 {
					return smp, errors.New("on B: the first PUBLISH after CONNACK has DUP=0 (not a resend)")
				}
			}
			pid, pay, err := parsePublish(p)
			seq, ok := seqOf(pay)
			if err != nil || !ok || seq >= uint64(total) {
				return smp, errors.New("on B: malformed PUBLISH")
			}
			if seen[seq] {
				smp.dup++
			} else {
				seen[seq] = true
				unique++
			}
			switch (p.header >> 1) & 3 {
			case 1:
				_, _ = bw.Write(appendAck(nil, pktPuback, pid))
			case 2:
				_, _ = bw.Write(appendAck(nil, pktPubrec, pid))
			}
		case pktPubrel:
			if smp.first == 0 { // a resent PUBREL is a resend too (QoS 2)
				smp.first = time.Since(t0)
			}
			if len(p.body) >= 2 {
				_, _ = bw.Write(appendAck(nil, pktPubcomp, binary.BigEndian.Uint16(p.body)))
			}
		default:
			return smp, fmt.Errorf("on B: unexpected packet type %d", p.typ())
		}
		if p.size > 0 {
			_, _ = r.Discard(p.size)
		}
	}
	smp.drain = time.Since(t0)
	_ = bw.Flush()
	// Let the last acks reach the broker before leaving.
	_, _ = conn.Write(disconnectPkt)
	_, _ = pub.Write(disconnectPkt)

	// 5. The connection on A must have been closed by the broker.
	_ = old.SetReadDeadline(time.Now().Add(2 * time.Second))
	for {
		p, err := readPacket(oldR, &scratch)
		if err != nil {
			smp.oldOpen = errors.Is(err, os.ErrDeadlineExceeded)
			break
		}
		if p.size > 0 {
			_, _ = oldR.Discard(p.size)
		}
	}
	return smp, nil
}

// pubConfirms reads the publisher's acks until `total` messages are
// confirmed (PUBACK, or PUBCOMP after answering PUBREC with PUBREL).
func pubConfirms(conn net.Conn, r *bufio.Reader, w *bufio.Writer, qos byte, total int, timeout time.Duration) error {
	_ = conn.SetReadDeadline(time.Now().Add(timeout))
	defer conn.SetReadDeadline(time.Time{})
	var scratch []byte
	done := 0
	for done < total {
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return fmt.Errorf("publisher: %w", err)
			}
		}
		p, err := readPacket(r, &scratch)
		if err != nil {
			return fmt.Errorf("publisher: %d of %d confirmed: %w", done, total, err)
		}
		switch t := p.typ(); {
		case t == pktPuback && qos == 1, t == pktPubcomp && qos == 2:
			done++
		case t == pktPubrec && qos == 2 && len(p.body) >= 2:
			_, _ = w.Write(appendAck(nil, pktPubrel, binary.BigEndian.Uint16(p.body)))
		default:
			return fmt.Errorf("publisher: unexpected packet type %d", t)
		}
		if p.size > 0 {
			_, _ = r.Discard(p.size)
		}
	}
	return nil
}

// readPublishes reads until n PUBLISHes arrived (without acking) or wait
// passes, and returns how many came.
func readPublishes(conn net.Conn, r *bufio.Reader, n int, wait time.Duration) (int, error) {
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	defer conn.SetReadDeadline(time.Time{})
	var scratch []byte
	got := 0
	for got < n {
		p, err := readPacket(r, &scratch)
		if err != nil {
			return got, err
		}
		switch p.typ() {
		case pktPublish:
			got++
		case pktSuback, pktPingresp:
		default:
			return got, fmt.Errorf("unexpected packet type %d", p.typ())
		}
		if p.size > 0 {
			_, _ = r.Discard(p.size)
		}
	}
	return got, nil
}
