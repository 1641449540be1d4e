package tokenizer

import "unicode/utf8"

// GPT-2 style byte-level BPE stores every token as a string of printable
// runes: each byte b maps to one rune, printable Latin-1 bytes to themselves
// and the rest to U+0100 upwards in byte order. The tables below convert in
// both directions so the tokenizer can work on raw bytes internally.

// byteToRune is the byte -> rune table of the byte-level alphabet.
var byteToRune = func() [256]rune {
	var t [256]rune
	next := rune(256)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = next
			next++
		}
	}
	return t
}()

// runeToByte inverts byteToRune; ok is false for a rune outside the alphabet.
func runeToByte(r rune) (b byte, ok bool) {
	// The alphabet is dense below U+0144, so a small table suffices.
	if r < 0 || int(r) >= len(runeToByteTable) {
		return 0, false
	}
	v := runeToByteTable[r]
	return byte(v), v >= 0
}

var runeToByteTable = func() [0x144]int16 {
	var t [0x144]int16
	for i := range t {
		t[i] = -1
	}
	for b, r := range byteToRune {
		t[r] = int16(b)
	}
	return t
}()

// byteLevelDecode turns a vocabulary string of the byte-level alphabet into
// the raw bytes it stands for; ok is false when a rune is outside the
// alphabet (such a token cannot come out of byte-level pre-tokenization).
func byteLevelDecode(s string) (raw string, ok bool) {
	buf := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := runeToByte(r)
		if !ok {
			return "", false
		}
		buf = append(buf, b)
	}
	return string(buf), true
}

// byteLevelEncode is the inverse of byteLevelDecode; used by tests and
// diagnostics.
func byteLevelEncode(raw string) string {
	buf := make([]byte, 0, 2*len(raw))
	for i := 0; i < len(raw); i++ {
		buf = utf8.AppendRune(buf, byteToRune[raw[i]])
	}
	return string(buf)
}
