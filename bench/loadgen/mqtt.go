package main

// Minimal MQTT 3.1.1 codec: just the packets the load generator needs, encoded
// into reusable byte slices so the hot path does no allocation or reflection.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	pktConnect     = 1
	pktConnack     = 2
	pktPublish     = 3
	pktPuback      = 4
	pktPubrec      = 5
	pktPubrel      = 6
	pktPubcomp     = 7
	pktSubscribe   = 8
	pktSuback      = 9
	pktPingresp    = 13
	pktDisconnect  = 14
	maxPacketBytes = 1 << 24
)

var errMalformed = errors.New("malformed packet")

// appendVarint appends the MQTT "remaining length" encoding of n.
func appendVarint(b []byte, n int) []byte {
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// encodeConnect encodes an MQTT 3.1.1 CONNECT; clean=false asks for a
// persistent session (clean_session=0).
func encodeConnect(clientID string, keepalive uint16, clean bool) []byte {
	var flags byte
	if clean {
		flags = 0x02
	}
	var body []byte
	body = appendString(body, "MQTT")
	body = append(body, 4, flags) // protocol level 3.1.1
	body = binary.BigEndian.AppendUint16(body, keepalive)
	body = appendString(body, clientID)
	out := appendVarint([]byte{pktConnect << 4}, len(body))
	return append(out, body...)
}

func encodeSubscribe(pid uint16, filter string, qos byte) []byte {
	var body []byte
	body = binary.BigEndian.AppendUint16(body, pid)
	body = appendString(body, filter)
	body = append(body, qos)
	out := appendVarint([]byte{pktSubscribe<<4 | 0x02}, len(body))
	return append(out, body...)
}

// encodePublish returns a PUBLISH packet plus the offsets of the packet id
// (or -1 for QoS 0) and of the payload, so callers can patch them in place.
func encodePublish(topic string, qos byte, payloadLen int) (pkt []byte, pidOff, payOff int) {
	rl := 2 + len(topic) + payloadLen
	if qos > 0 {
		rl += 2
	}
	pkt = appendVarint([]byte{pktPublish<<4 | qos<<1}, rl)
	pkt = appendString(pkt, topic)
	pidOff = -1
	if qos > 0 {
		pidOff = len(pkt)
		pkt = append(pkt, 0, 0)
	}
	payOff = len(pkt)
	pkt = append(pkt, make([]byte, payloadLen)...)
	return pkt, pidOff, payOff
}

// appendAck appends a 4-byte PUBACK/PUBREC/PUBREL/PUBCOMP.
func appendAck(b []byte, typ byte, pid uint16) []byte {
	h := typ << 4
	if typ == pktPubrel {
		h |= 0x02
	}
	return append(b, h, 2, byte(pid>>8), byte(pid))
}

var disconnectPkt = []byte{pktDisconnect << 4, 0}

// packet is a view into the reader's buffer; valid until the next readPacket.
type packet struct {
	header byte
	body   []byte
	size   int // bytes to discard after use
}

func (p packet) typ() byte { return p.header >> 4 }

// readPacket peeks one whole packet from r without copying it.
func readPacket(r *bufio.Reader, scratch *[]byte) (packet, error) {
	hdr, err := r.Peek(2)
	if err != nil {
		return packet{}, err
	}
	rl, mult, n := 0, 1, 1
	for {
		if n > 4 {
			return packet{}, errMalformed
		}
		if n >= len(hdr) {
			if hdr, err = r.Peek(n + 1); err != nil {
				return packet{}, err
			}
		}
		d := hdr[n]
		rl += int(d&0x7f) * mult
		mult *= 128
		n++
		if d&0x80 == 0 {
			break
		}
	}
	if rl > maxPacketBytes {
		return packet{}, fmt.Errorf("packet too large: %d", rl)
	}
	total := n + rl
	if total <= r.Size() {
		buf, err := r.Peek(total)
		if err != nil {
			return packet{}, err
		}
		return packet{header: buf[0], body: buf[n:], size: total}, nil
	}
	// Larger than the read buffer: copy out.
	h := hdr[0]
	if _, err := r.Discard(n); err != nil {
		return packet{}, err
	}
	if cap(*scratch) < rl {
		*scratch = make([]byte, rl)
	}
	body := (*scratch)[:rl]
	if _, err := io.ReadFull(r, body); err != nil {
		return packet{}, err
	}
	return packet{header: h, body: body, size: 0}, nil
}

// parsePublish splits a PUBLISH body into topic length, packet id and payload.
func parsePublish(p packet) (pid uint16, payload []byte, err error) {
	b := p.body
	if len(b) < 2 {
		return 0, nil, errMalformed
	}
	tl := int(binary.BigEndian.Uint16(b))
	off := 2 + tl
	qos := (p.header >> 1) & 3
	if qos > 0 {
		if len(b) < off+2 {
			return 0, nil, errMalformed
		}
		pid = binary.BigEndian.Uint16(b[off:])
		off += 2
	}
	if len(b) < off {
		return 0, nil, errMalformed
	}
	return pid, b[off:], nil
}
