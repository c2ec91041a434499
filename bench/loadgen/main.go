// Command loadgen is fleetmq's MQTT 3.1.1 benchmark load generator: raw TCP,
// pre-encoded packets and closed-loop publishers, so that it costs far less
// CPU than the broker under test and never becomes the bottleneck.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"
)

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// raiseNofile lifts the soft fd limit to the hard limit (idle mode needs 10k+).
func raiseNofile() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}

func main() {
	cfg := &config{}
	flag.StringVar(&cfg.host, "host", "127.0.0.1", "broker host")
	flag.IntVar(&cfg.port, "port", 1883, "broker port (publishers; takeover: the first node)")
	flag.StringVar(&cfg.subHost, "sub-host", "", "subscribers' broker host (default -host; takeover: the second node)")
	flag.IntVar(&cfg.subPort, "sub-port", 0, "subscribers' broker port (default -port; takeover: the second node)")
	flag.BoolVar(&cfg.clean, "clean", true, "clean_session flag: -clean=false for persistent sessions (client ids are unique per run)")
	flag.StringVar(&cfg.mode, "mode", "pt2pt", "pt2pt | fanout | fanin | idle | broadcast | takeover")
	flag.IntVar(&cfg.qos, "qos", 0, "QoS 0, 1 or 2")
	flag.IntVar(&cfg.payload, "payload", 64, "payload bytes (>= 20)")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "measurement duration")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "warmup before measuring")
	flag.DurationVar(&cfg.drain, "drain", 3*time.Second, "max wait for in-flight messages after publishing stops")
	flag.DurationVar(&cfg.ackDelay, "ack-delay", 500*time.Microsecond, "max time a subscriber holds back a partial batch of acks (0: flush per read)")
	procs := flag.Int("procs", 1, "GOMAXPROCS: 1 keeps the generator on one core, leaving the rest to the broker")
	flag.IntVar(&cfg.window, "window", 200, "max outstanding messages per publisher")
	flag.IntVar(&cfg.batch, "batch", 0, "after the window fills, resume once this many slots are free (default window/8)")
	flag.IntVar(&cfg.pubs, "pubs", 0, "publishers (default by mode: fanin 10, else 1)")
	flag.IntVar(&cfg.subs, "subs", 0, "subscribers (default by mode: fanout 10, else 1)")
	flag.StringVar(&cfg.runID, "run-id", "", "topic/client-id namespace (default random)")
	conns := flag.Int("conns", 10000, "idle, broadcast: connections to open")
	concurrency := flag.Int("concurrency", 200, "idle, broadcast: connects in flight at once")
	messages := flag.Int("messages", 20, "broadcast: messages published to every connection (at -qos 0 or 1)")
	hold := flag.Duration("hold", 10*time.Second, "idle: how long to hold connections (or until stdin closes)")
	subscribeEach := flag.Bool("subscribe", false, "idle: each connection subscribes (QoS 1) to a topic of its own")
	reps := flag.Int("reps", 30, "takeover: measured repetitions (a new client id each)")
	warmupReps := flag.Int("warmup-reps", 2, "takeover: unmeasured repetitions first")
	queued := flag.Int("queued", 1000, "takeover: messages queued behind the full inflight window")
	inflight := flag.Int("inflight", 32, "takeover: the broker's max_inflight (the window the old connection fills)")
	tlsCA := flag.String("tls-ca", "", "connect with TLS, verifying the broker against this PEM CA file")
	cpuPids := flag.String("cpu-pids", "", "name=pid,...: report each process's CPU seconds in the measured window")
	asJSON := flag.Bool("json", false, "print one JSON object")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile here (development aid)")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fatal(err.Error())
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}

	pids, err := parsePids(*cpuPids)
	if err != nil {
		fatal(err.Error())
	}
	cfg.cpuPids = pids
	runtime.GOMAXPROCS(*procs)
	raiseNofile()
	if *tlsCA != "" {
		if err := loadTLS(*tlsCA, cfg.host); err != nil {
			fatal("tls: " + err.Error())
		}
	}
	if cfg.runID == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.runID = hex.EncodeToString(b)
	}
	if cfg.subHost == "" {
		cfg.subHost = cfg.host
	}
	if cfg.subPort == 0 {
		cfg.subPort = cfg.port
	}
	if cfg.qos < 0 || cfg.qos > 2 {
		fatal("qos must be 0, 1 or 2")
	}
	if cfg.payload < payMin {
		fatal(fmt.Sprintf("payload must be >= %d bytes", payMin))
	}
	if cfg.window < 1 || cfg.window > 65535 {
		fatal("window must be in 1..65535")
	}
	if cfg.batch <= 0 {
		cfg.batch = max(1, cfg.window/8)
	}
	if cfg.mode == "idle" {
		os.Exit(runIdle(cfg, *conns, *concurrency, *subscribeEach, *hold, *asJSON))
	}
	if cfg.mode == "broadcast" {
		if cfg.qos > 1 {
			fatal("broadcast: qos 0 or 1")
		}
		res := runBroadcast(cfg, *conns, *concurrency, *messages, cfg.cpuPids, 30*time.Second+cfg.drain)
		emit(res, *asJSON)
		if res.Error != "" {
			os.Exit(1)
		}
		return
	}
	if cfg.mode == "takeover" {
		res := runTakeover(cfg, *reps, *warmupReps, *queued, *inflight)
		emit(res, *asJSON)
		if res.Error != "" {
			os.Exit(1)
		}
		return
	}
	defPubs, defSubs := 1, 1
	switch cfg.mode {
	case "pt2pt":
	case "fanout":
		defSubs = 10
	case "fanin":
		defPubs = 10
	default:
		fatal("unknown mode " + cfg.mode)
	}
	if cfg.pubs <= 0 {
		cfg.pubs = defPubs
	}
	if cfg.subs <= 0 {
		cfg.subs = defSubs
	}
	res := runFlow(cfg)
	emit(res, *asJSON)
	if res.Error != "" {
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func fatal(msg string) {
	fmt.Fprintln(os.Stderr, "loadgen:", msg)
	os.Exit(2)
}
