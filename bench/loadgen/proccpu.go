package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat: fixed at 100 by
// the Linux userspace ABI, whatever the kernel's internal tick rate.
const userHZ = 100.0

// procCPU is a process's user + system CPU seconds so far, all its threads
// together, from /proc/<pid>/stat (fields 14 and 15, counted after the
// command name, which may itself hold spaces and parentheses).
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return 0, fmt.Errorf("pid %d: unexpected stat line", pid)
	}
	f := strings.Fields(s[end+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("pid %d: short stat line", pid)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("pid %d: bad utime/stime", pid)
	}
	return (ut + st) / userHZ, nil
}

// parsePids reads "name=pid,name=pid" (the -cpu-pids flag).
func parsePids(spec string) (map[string]int, error) {
	out := map[string]int{}
	for _, part := range strings.Split(spec, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, pid, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || name == "" {
			return nil, fmt.Errorf("-cpu-pids: want name=pid, got %q", part)
		}
		out[name] = n
	}
	return out, nil
}

// windowCPU samples the named processes' CPU time at start and at end (Unix
// nanoseconds) and delivers, per name, the seconds used in between: the
// brokers' cost of exactly the messages counted in the measured window.
func windowCPU(pids map[string]int, start, end int64) <-chan map[string]float64 {
	done := make(chan map[string]float64, 1)
	if len(pids) == 0 {
		done <- nil
		return done
	}
	go func() {
		time.Sleep(time.Duration(start - nowNs()))
		before := sampleCPU(pids)
		time.Sleep(time.Duration(end - nowNs()))
		after := sampleCPU(pids)
		out := map[string]float64{}
		for name, v := range after {
			if v0, ok := before[name]; ok {
				out[name] = v - v0
			}
		}
		done <- out
	}()
	return done
}

// sampleCPU is each named process's CPU seconds so far (those that can be read).
func sampleCPU(pids map[string]int) map[string]float64 {
	m := map[string]float64{}
	for name, pid := range pids {
		if v, err := procCPU(pid); err == nil {
			m[name] = v
		}
	}
	return m
}
