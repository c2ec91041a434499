package main

// Closed-loop throughput/latency scenarios (pt2pt, fanout, fanin).
//
// Every publisher owns a ring of `window` slots. Slot s holds the number of
// events still missing before message seq (seq%window == s) is complete: one
// per subscriber that must receive it plus, for QoS 1/2, the end of the
// publisher's own ack flow. A publisher only sends seq once its slot is free,
// so at most `window` messages per publisher are ever in flight and the broker
// cannot build unbounded queues; latency is therefore meaningful at every QoS.

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

const (
	ioBufSize = 64 << 10
	// Payload layout: send timestamp (ns since epoch), sequence, publisher index.
	payTS  = 0
	paySeq = 8
	payPub = 16
	payMin = 20
	// ackFlushBytes: queued acks are written at once from this many bytes (16 acks).
	ackFlushBytes = 64
)

var epoch = time.Now()

// nowNs is monotonic nanoseconds since process start (both ends share it).
func nowNs() int64 { return int64(time.Since(epoch)) }

type config struct {
	host, mode       string
	port, qos        int
	subHost          string // subscribers' broker (default host): another node of a fleet
	subPort          int    // subscribers' port (default port)
	clean            bool   // clean_session flag of every CONNECT
	payload, window  int
	batch            int
	duration, warmup time.Duration
	drain, ackDelay  time.Duration
	runID            string
	pubs, subs       int
	cpuPids          map[string]int // processes whose CPU the measured window is charged (-cpu-pids)
}

type runState struct {
	cfg          *config
	pubs         []*publisher
	need         int32 // events per message until complete
	measureStart int64
	measureEnd   int64
	closing      atomic.Bool
	errOnce      sync.Once
	err          atomic.Value // string
}

func (s *runState) fail(format string, a ...any) {
	if s.closing.Load() {
		return
	}
	s.errOnce.Do(func() { s.err.Store(fmt.Sprintf(format, a...)) })
}

func (s *runState) errMsg() string {
	if v := s.err.Load(); v != nil {
		return v.(string)
	}
	return ""
}

// lockedWriter is a connection's buffered writer, shared by the goroutine
// that publishes and the one that writes acks.
type lockedWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func newLockedWriter(c net.Conn) *lockedWriter {
	return &lockedWriter{w: bufio.NewWriterSize(c, ioBufSize)}
}

func (l *lockedWriter) write(b []byte) error {
	l.mu.Lock()
	_, err := l.w.Write(b)
	l.mu.Unlock()
	return err
}

func (l *lockedWriter) flush() error {
	l.mu.Lock()
	err := l.w.Flush()
	l.mu.Unlock()
	return err
}

func (l *lockedWriter) pending() int {
	l.mu.Lock()
	n := l.w.Buffered()
	l.mu.Unlock()
	return n
}

// client is one connection's read side plus its deferred-ack state.
type client struct {
	conn    net.Conn
	r       *bufio.Reader
	w       *lockedWriter
	armed   bool // read deadline set to flush straggling acks
	scratch []byte
}

// next returns the next packet. Before a read that may block it writes
// queued acks, but holds back a partial batch for up to ackDelay (via a read
// deadline) so that one write syscall carries many acks: a loopback write
// costs the sender the receiver's TCP processing too, so this is what keeps
// the generator's CPU well below the broker's.
func (c *client) next(ackDelay time.Duration) (packet, error) {
	for {
		if c.r.Buffered() == 0 {
			if n := c.w.pending(); n >= ackFlushBytes || (n > 0 && ackDelay <= 0) {
				if err := c.w.flush(); err != nil {
					return packet{}, err
				}
			} else if n > 0 && !c.armed {
				c.armed = true
				if err := c.conn.SetReadDeadline(time.Now().Add(ackDelay)); err != nil {
					return packet{}, err
				}
			}
		}
		p, err := readPacket(c.r, &c.scratch)
		if err == nil || !c.armed || !errors.Is(err, os.ErrDeadlineExceeded) {
			return p, err
		}
		c.armed = false
		if err := c.conn.SetReadDeadline(time.Time{}); err != nil {
			return packet{}, err
		}
		if err := c.w.flush(); err != nil {
			return packet{}, err
		}
	}
}

func (c *client) done(p packet) {
	if p.size > 0 {
		_, _ = c.r.Discard(p.size)
	}
}

type publisher struct {
	client
	idx    int
	topic  string
	ring   []int32
	wake   chan struct{}
	want   atomic.Int32 // slot the writer sleeps on (-1: none)
	sent   atomic.Int64
	stopCh chan struct{}
	done   chan struct{}
}

type subscriber struct {
	client
	seen     [][]uint64 // per publisher: bitset of received seqs
	unique   int64
	dups     int64
	measured int64
	hist     histogram
	done     chan struct{}
}

// complete records one finished event for (publisher, slot) and wakes the
// publisher if it sleeps on exactly that slot.
func (s *runState) complete(p *publisher, slot int) {
	if atomic.AddInt32(&p.ring[slot], -1) == 0 && int32(slot) == p.want.Load() {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// dial connects a publisher (or an idle connection) to host:port.
func dial(cfg *config, clientID string, keepalive uint16) (net.Conn, *bufio.Reader, error) {
	conn, r, _, err := dialAddr(net.JoinHostPort(cfg.host, fmt.Sprint(cfg.port)), clientID, keepalive, cfg.clean)
	return conn, r, err
}

// dialSub connects a subscriber to sub-host:sub-port.
func dialSub(cfg *config, clientID string, keepalive uint16) (net.Conn, *bufio.Reader, error) {
	conn, r, _, err := dialAddr(net.JoinHostPort(cfg.subHost, fmt.Sprint(cfg.subPort)), clientID, keepalive, cfg.clean)
	return conn, r, err
}

// tlsConfig is set by -tls-ca: every connection then speaks TLS, verified against that CA.
var tlsConfig *tls.Config

func tcpDial(addr string) (net.Conn, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if tlsConfig == nil {
		return conn, nil
	}
	tc := tls.Client(conn, tlsConfig)
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// loadTLS makes the client TLS config from a PEM CA file (the broker's certificate is for host).
func loadTLS(caFile, host string) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s: no PEM certificates", caFile)
	}
	tlsConfig = &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}
	return nil
}

// dialAddr connects, sends CONNECT and waits for a successful CONNACK; it
// reports the CONNACK's session-present flag.
func dialAddr(addr, clientID string, keepalive uint16, clean bool) (net.Conn, *bufio.Reader, bool, error) {
	conn, err := tcpDial(addr)
	if err != nil {
		return nil, nil, false, err
	}
	if _, err := conn.Write(encodeConnect(clientID, keepalive, clean)); err != nil {
		conn.Close()
		return nil, nil, false, err
	}
	r := bufio.NewReaderSize(conn, ioBufSize)
	present, err := readConnack(conn, r, 15*time.Second)
	if err != nil {
		conn.Close()
		return nil, nil, false, err
	}
	return conn, r, present, nil
}

// readConnack reads the CONNACK, which must accept the connection, and
// returns its session-present flag.
func readConnack(conn net.Conn, r *bufio.Reader, timeout time.Duration) (bool, error) {
	_ = conn.SetReadDeadline(time.Now().Add(timeout))
	defer conn.SetReadDeadline(time.Time{})
	var scratch []byte
	p, err := readPacket(r, &scratch)
	if err != nil {
		return false, fmt.Errorf("waiting for CONNACK: %w", err)
	}
	if p.typ() != pktConnack || len(p.body) < 2 || p.body[1] != 0 {
		return false, fmt.Errorf("bad CONNACK (header %#x body %v)", p.header, p.body)
	}
	present := p.body[0]&1 != 0
	_, _ = r.Discard(p.size)
	return present, nil
}

func subscribe(conn net.Conn, r *bufio.Reader, filter string, qos byte) error {
	if _, err := conn.Write(encodeSubscribe(1, filter, qos)); err != nil {
		return err
	}
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	var scratch []byte
	p, err := readPacket(r, &scratch)
	if err != nil {
		return fmt.Errorf("waiting for SUBACK: %w", err)
	}
	if p.typ() != pktSuback || len(p.body) < 3 || p.body[2] == 0x80 {
		return fmt.Errorf("bad SUBACK (header %#x body %v)", p.header, p.body)
	}
	_, _ = r.Discard(p.size)
	return nil
}

// subLoop reads deliveries, acks them and records stats.
func (s *runState) subLoop(sub *subscriber) {
	defer close(sub.done)
	ack := make([]byte, 0, 4)
	npubs := len(s.pubs)
	for {
		p, err := sub.next(s.cfg.ackDelay)
		if err != nil {
			s.fail("subscriber: %v", err)
			return
		}
		now := nowNs()
		ack = ack[:0]
		switch p.typ() {
		case pktPublish:
			pid, pay, err := parsePublish(p)
			if err == nil && isProbe(p.header, pay) {
				break // a late route probe (see waitRoutes)
			}
			if err != nil || len(pay) < payMin {
				s.fail("subscriber: malformed PUBLISH")
				return
			}
			switch (p.header >> 1) & 3 {
			case 1:
				ack = appendAck(ack, pktPuback, pid)
			case 2:
				ack = appendAck(ack, pktPubrec, pid)
			}
			ts := int64(binary.LittleEndian.Uint64(pay[payTS:]))
			seq := binary.LittleEndian.Uint64(pay[paySeq:])
			pi := int(binary.LittleEndian.Uint32(pay[payPub:]))
			if pi >= npubs {
				s.fail("subscriber: bad publisher index %d", pi)
				return
			}
			bs := sub.seen[pi]
			word := int(seq >> 6)
			for word >= len(bs) {
				bs = append(bs, make([]uint64, len(bs)+1024)...)
			}
			sub.seen[pi] = bs
			if bit := uint64(1) << (seq & 63); bs[word]&bit != 0 {
				sub.dups++
			} else {
				bs[word] |= bit
				sub.unique++
				pub := s.pubs[pi]
				s.complete(pub, int(seq%uint64(len(pub.ring))))
			}
			if now >= s.measureStart && now < s.measureEnd {
				sub.measured++
				sub.hist.record(now - ts)
			}
		case pktPubrel:
			if len(p.body) < 2 {
				s.fail("subscriber: malformed PUBREL")
				return
			}
			ack = appendAck(ack, pktPubcomp, binary.BigEndian.Uint16(p.body))
		case pktPingresp, pktSuback:
		default:
			s.fail("subscriber: unexpected packet type %d", p.typ())
			return
		}
		sub.client.done(p)
		if len(ack) > 0 {
			if err := sub.w.write(ack); err != nil {
				s.fail("subscriber write: %v", err)
				return
			}
		}
	}
}

// pubReadLoop consumes the publisher's ack flow (PUBACK / PUBREC / PUBCOMP)
// and answers PUBREC with PUBREL.
func (s *runState) pubReadLoop(p *publisher) {
	rel := make([]byte, 0, 4)
	qos := s.cfg.qos
	for {
		// PUBREL is on the critical path of the window: never hold it back.
		pk, err := p.next(0)
		if err != nil {
			s.fail("publisher: %v", err)
			return
		}
		switch t := pk.typ(); t {
		case pktPuback, pktPubrec, pktPubcomp:
			if len(pk.body) < 2 {
				s.fail("publisher: malformed ack")
				return
			}
			pid := binary.BigEndian.Uint16(pk.body)
			slot := int(pid) - 1
			if slot < 0 || slot >= len(p.ring) {
				s.fail("publisher: ack for unknown packet id %d", pid)
				return
			}
			switch {
			case t == pktPuback && qos == 1, t == pktPubcomp && qos == 2:
				s.complete(p, slot)
			case t == pktPubrec && qos == 2:
				if err := p.w.write(appendAck(rel[:0], pktPubrel, pid)); err != nil {
					s.fail("publisher write: %v", err)
					return
				}
			default:
				s.fail("publisher: unexpected ack type %d at QoS %d", t, qos)
				return
			}
		case pktPingresp:
		default:
			s.fail("publisher: unexpected packet type %d", t)
			return
		}
		p.client.done(pk)
	}
}

// waitFree registers slot as the one to be woken for and reports whether
// the writer must actually sleep (slot still busy).
func waitFree(p *publisher, slot int32) bool {
	p.want.Store(slot)
	return atomic.LoadInt32(&p.ring[slot]) != 0
}

// pubWriteLoop sends PUBLISHes while the window allows, flushing only when it
// must wait (window exhausted), so packets go out in large batches.
func (s *runState) pubWriteLoop(p *publisher) {
	defer close(p.done)
	cfg := s.cfg
	pkt, pidOff, payOff := encodePublish(p.topic, byte(cfg.qos), cfg.payload)
	binary.LittleEndian.PutUint32(pkt[payOff+payPub:], uint32(p.idx))
	win := uint64(len(p.ring))
	batch := uint64(max(1, min(cfg.batch, len(p.ring))))
	var seq uint64
	for {
		select {
		case <-p.stopCh:
			if err := p.w.flush(); err != nil {
				s.fail("publisher write: %v", err)
			}
			return
		default:
		}
		slot := int(seq % win)
		if atomic.LoadInt32(&p.ring[slot]) != 0 {
			// Window exhausted: flush, then sleep until `batch` slots are free
			// again so that each wakeup sends a batch rather than one message.
			if err := p.w.flush(); err != nil {
				s.fail("publisher write: %v", err)
				return
			}
			if waitFree(p, int32((seq+batch-1)%win)) || waitFree(p, int32(slot)) {
				select {
				case <-p.wake:
				case <-p.stopCh:
				}
			}
			p.want.Store(-1)
			continue
		}
		atomic.StoreInt32(&p.ring[slot], s.need)
		if pidOff >= 0 {
			binary.BigEndian.PutUint16(pkt[pidOff:], uint16(slot+1))
		}
		binary.LittleEndian.PutUint64(pkt[payOff+paySeq:], seq)
		binary.LittleEndian.PutUint64(pkt[payOff+payTS:], uint64(nowNs()))
		if err := p.w.write(pkt); err != nil {
			s.fail("publisher write: %v", err)
			return
		}
		seq++
		p.sent.Store(int64(seq))
	}
}

type result struct {
	Mode        string  `json:"mode"`
	QoS         int     `json:"qos"`
	MsgsPerS    float64 `json:"msgs_per_s"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	Delivered   int64   `json:"delivered"`
	Lost        int64   `json:"lost"`
	Dup         int64   `json:"dup"`
	DurationS   float64 `json:"duration_s"`
	Sent        int64   `json:"sent"`
	Publishers  int     `json:"publishers"`
	Subscribers int     `json:"subscribers"`
	Window      int     `json:"window"`
	Batch       int     `json:"batch"`
	CPUs        float64 `json:"loadgen_cpu_s"`
	// user + system CPU seconds of each -cpu-pids process during the measured window
	WindowCPU map[string]float64 `json:"window_cpu_s,omitempty"`
	Error     string             `json:"error,omitempty"`
}

func runFlow(cfg *config) result {
	res := result{Mode: cfg.mode, QoS: cfg.qos, Publishers: cfg.pubs, Subscribers: cfg.subs,
		Window: cfg.window, Batch: cfg.batch}
	s := &runState{cfg: cfg, need: int32(cfg.subs)}
	if cfg.qos > 0 {
		s.need++
	}
	s.measureStart, s.measureEnd = 1<<62, 1<<62
	prefix := "bench/" + cfg.runID
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	filter := prefix + "/t"
	if cfg.pubs > 1 {
		filter = prefix + "/+"
	}
	var subs []*subscriber
	for i := 0; i < cfg.subs; i++ {
		conn, r, err := dialSub(cfg, fmt.Sprintf("bench-%s-sub-%d", cfg.runID, i), 60)
		if err != nil {
			res.Error = fmt.Sprintf("subscriber %d connect: %v", i, err)
			return res
		}
		conns = append(conns, conn)
		if err := subscribe(conn, r, filter, byte(cfg.qos)); err != nil {
			res.Error = fmt.Sprintf("subscriber %d: %v", i, err)
			return res
		}
		subs = append(subs, &subscriber{
			client: client{conn: conn, r: r, w: newLockedWriter(conn)},
			seen:   make([][]uint64, cfg.pubs), done: make(chan struct{}),
		})
	}
	for i := 0; i < cfg.pubs; i++ {
		topic := prefix + "/t"
		if cfg.pubs > 1 {
			topic = fmt.Sprintf("%s/p%d", prefix, i)
		}
		conn, r, err := dial(cfg, fmt.Sprintf("bench-%s-pub-%d", cfg.runID, i), 60)
		if err != nil {
			res.Error = fmt.Sprintf("publisher %d connect: %v", i, err)
			return res
		}
		conns = append(conns, conn)
		p := &publisher{
			client: client{conn: conn, r: r, w: newLockedWriter(conn)},
			idx:    i, topic: topic, ring: make([]int32, cfg.window),
			wake: make(chan struct{}, 1), stopCh: make(chan struct{}), done: make(chan struct{}),
		}
		p.want.Store(-1)
		s.pubs = append(s.pubs, p)
	}
	if cfg.subHost != cfg.host || cfg.subPort != cfg.port {
		// Subscribers on another node: the subscription must have reached the
		// publishers' node first, or the first messages would not be routed.
		if err := waitRoutes(subs, s.pubs, 10*time.Second); err != nil {
			res.Error = err.Error()
			return res
		}
	}
	// Give the broker a moment to finish installing subscriptions everywhere.
	time.Sleep(100 * time.Millisecond)
	cpu0 := cpuSeconds()
	start := nowNs()
	s.measureStart = start + int64(cfg.warmup)
	s.measureEnd = s.measureStart + int64(cfg.duration)
	windowDone := windowCPU(cfg.cpuPids, s.measureStart, s.measureEnd)
	for _, sub := range subs {
		go s.subLoop(sub)
	}
	for _, p := range s.pubs {
		go s.pubReadLoop(p)
		go s.pubWriteLoop(p)
	}
	// Run until the measurement window ends, or bail out early on failure.
	timer := time.NewTimer(time.Duration(s.measureEnd - nowNs()))
	tick := time.NewTicker(50 * time.Millisecond)
wait:
	for {
		select {
		case <-timer.C:
			break wait
		case <-tick.C:
			if s.errMsg() != "" {
				break wait
			}
		}
	}
	tick.Stop()
	for _, p := range s.pubs {
		close(p.stopCh)
	}
	// A writer blocked on a broker that stopped reading is released below,
	// when the connections close.
	drainUntil := time.Now().Add(cfg.drain)
	for _, p := range s.pubs {
		select {
		case <-p.done:
		case <-time.After(time.Until(drainUntil)):
		}
	}
	// Drain: wait until every sent message is complete (or give up) so that
	// in-flight messages are not miscounted as lost.
	for time.Now().Before(drainUntil) && s.errMsg() == "" && s.busy() {
		time.Sleep(10 * time.Millisecond)
	}
	res.CPUs = cpuSeconds() - cpu0
	if s.errMsg() == "" {
		res.WindowCPU = <-windowDone // the window has ended: the sample is ready
	}
	s.closing.Store(true)
	for _, c := range conns {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(disconnectPkt)
		_ = c.Close()
	}
	for _, sub := range subs {
		<-sub.done
	}
	for _, p := range s.pubs {
		<-p.done
	}
	var h histogram
	var unique, measured int64
	for _, sub := range subs {
		h.merge(&sub.hist)
		unique += sub.unique
		measured += sub.measured
		res.Dup += sub.dups
	}
	for _, p := range s.pubs {
		res.Sent += p.sent.Load()
	}
	res.Delivered = measured
	res.Lost = res.Sent*int64(cfg.subs) - unique
	res.DurationS = cfg.duration.Seconds()
	res.MsgsPerS = float64(measured) / cfg.duration.Seconds()
	res.P50us = float64(h.quantile(0.50)) / 1e3
	res.P99us = float64(h.quantile(0.99)) / 1e3
	res.Error = s.errMsg()
	if res.Error == "" && measured == 0 {
		res.Error = "no messages delivered during the measurement window"
	}
	return res
}

// busy reports whether any sent message is still incomplete.
func (s *runState) busy() bool {
	for _, p := range s.pubs {
		for i := range p.ring {
			if atomic.LoadInt32(&p.ring[i]) != 0 {
				return true
			}
		}
	}
	return false
}

// probePayload marks the QoS 0 messages of waitRoutes; real payloads are
// at least payMin bytes, so the two cannot be confused.
var probePayload = []byte("probe")

func isProbe(header byte, pay []byte) bool {
	return (header>>1)&3 == 0 && string(pay) == string(probePayload)
}

// waitRoutes publishes QoS 0 probes on every publisher's topic until every
// subscriber has received one from each publisher (the route of its
// subscription reached the publisher's node), or fails after timeout.
func waitRoutes(subs []*subscriber, pubs []*publisher, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for si, sub := range subs {
		for pi, p := range pubs {
			pkt, _, payOff := encodePublish(p.topic, 0, len(probePayload))
			copy(pkt[payOff:], probePayload)
			for {
				if time.Now().After(deadline) {
					return fmt.Errorf("route wait: no probe from publisher %d reached subscriber %d within %v", pi, si, timeout)
				}
				if _, err := p.conn.Write(pkt); err != nil {
					return fmt.Errorf("route wait: publisher %d: %w", pi, err)
				}
				ok, err := readProbe(&sub.client, 100*time.Millisecond)
				if err != nil {
					return fmt.Errorf("route wait: subscriber %d: %w", si, err)
				}
				if ok {
					break
				}
			}
		}
	}
	return nil
}

// readProbe reads packets for up to wait and reports whether a probe came.
func readProbe(c *client, wait time.Duration) (bool, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	defer c.conn.SetReadDeadline(time.Time{})
	for {
		p, err := readPacket(c.r, &c.scratch)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		probe := false
		if p.typ() == pktPublish {
			_, pay, perr := parsePublish(p)
			probe = perr == nil && isProbe(p.header, pay)
		}
		c.done(p)
		if probe {
			return true, nil
		}
	}
}
