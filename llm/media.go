package llm

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"regexp"
	"strconv"
)

// AudioTokensPerSecond bounds the tokens a second of audio input is
// billed as: Gemini counts 32, OpenAI's audio models about 10.
const AudioTokensPerSecond = 32

// MaxMediaTokens bounds the input tokens of one audio or video item whose
// duration is not known from its bytes (a format not read here, a file
// given by URL or id): the largest context window of the models that
// take them, Gemini's 1,048,576 tokens, past which a provider refuses the
// call. It is the true bound, and a heavy one: send WAV, FLAC, MP3 or
// Ogg inline to be reserved by duration.
const MaxMediaTokens = 1 << 20

// audioTokensJSON bounds the input tokens of one audio clip, data its base64
// JSON string (quoted): its duration times AudioTokensPerSecond, at most
// MaxMediaTokens. The duration is read from the clip as a decoder finds
// it: a WAV's size over its sample rate and frame size (PCM, float, A-law
// and μ-law), a FLAC's stream header, an MP3's frames one by one, an Ogg
// stream's last granule position (Opus at 48 kHz, Vorbis at its header's
// rate). A clip of any other format, or one whose duration cannot be read,
// counts MaxMediaTokens: compressed audio of silence takes a few bytes a
// second, so no size says how long a clip plays.
func audioTokensJSON(data []byte) int64 { return audioTokens(unquote(data)) }

// audioTokens is audioTokensJSON of b64, the string's value.
func audioTokens(b64 []byte) int64 {
	b, err := decodeBase64(b64)
	if err != nil {
		return MaxMediaTokens
	}
	seconds, ok := audioSeconds(b)
	if !ok {
		return MaxMediaTokens
	}
	return min(max(int64(seconds*AudioTokensPerSecond+0.999999), 1), MaxMediaTokens)
}

// decodeBase64 decodes data (a JSON string's value, unescaped) in any of
// the base64 alphabets JSON clients use, with or without padding,
// ignoring the line breaks and spaces some insert.
func decodeBase64(data []byte) ([]byte, error) {
	if bytes.ContainsAny(data, "\r\n\t ") {
		data = bytes.Map(func(r rune) rune {
			if r == '\r' || r == '\n' || r == '\t' || r == ' ' {
				return -1
			}
			return r
		}, data)
	}
	// One buffer for every alphabet tried (the unpadded ones need the
	// most): data that is none of them costs its size once, not four
	// times.
	out := make([]byte, base64.RawStdEncoding.DecodedLen(len(data)))
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		var n int
		if n, err = enc.Decode(out, data); err == nil {
			return out[:n], nil
		}
	}
	return nil, err
}

// audioSeconds returns how long the audio file b plays, and whether its
// format is one read here.
func audioSeconds(b []byte) (float64, bool) {
	// An ID3v2 tag may lead any of them: a decoder skips it.
	for len(b) >= 10 && string(b[0:3]) == "ID3" {
		size := 10 + (int(b[6]&0x7F)<<21 | int(b[7]&0x7F)<<14 | int(b[8]&0x7F)<<7 | int(b[9]&0x7F))
		if b[5]&0x10 != 0 {
			size += 10 // a footer
		}
		if size > len(b) {
			return 0, false
		}
		b = b[size:]
	}
	switch {
	case len(b) >= 12 && string(b[0:4]) == "RIFF" && string(b[8:12]) == "WAVE":
		return wavSeconds(b)
	case len(b) >= 4 && string(b[0:4]) == "fLaC":
		return flacSeconds(b)
	case len(b) >= 4 && string(b[0:4]) == "OggS":
		return oggSeconds(b)
	case len(b) >= 2 && b[0] == 0xFF:
		// Bare frames: MPEG audio, or FLAC's without their stream
		// header, each of which a decoder plays; the longer reading.
		mp3, _ := mp3Seconds(b)
		seconds := max(mp3, flacFrameSeconds(b, 0))
		return seconds, seconds > 0
	}
	return 0, false
}

// wavSeconds reads a WAV's fmt chunk: its size over the bytes a second of
// its samples take (its rate times its channels' samples, or its block
// size if smaller), for the uncompressed encodings (PCM, float, A-law,
// μ-law) whose frames are fixed.
func wavSeconds(b []byte) (float64, bool) {
	for i := 12; i+8 <= len(b); {
		id, size := string(b[i:i+4]), int(binary.LittleEndian.Uint32(b[i+4:i+8]))
		if id == "fmt " && i+8+16 <= len(b) {
			f := b[i+8:]
			format := binary.LittleEndian.Uint16(f[0:2])
			channels := float64(binary.LittleEndian.Uint16(f[2:4]))
			rate := float64(binary.LittleEndian.Uint32(f[4:8]))
			// A frame is its channels' samples: a decoder sizes it so,
			// whatever the block size the header claims; the smaller of
			// the two, so that neither lie shortens the clip.
			bits := float64(binary.LittleEndian.Uint16(f[14:16]))
			frame := min(float64(binary.LittleEndian.Uint16(f[12:14])), channels*float64((int(bits)+7)/8))
			if format != 1 && format != 3 && format != 6 && format != 7 || rate < 1 {
				return 0, false
			}
			frame = max(frame, 1)
			// The whole file, header included, as if it were samples: a
			// data chunk that claims less than follows is not believed.
			return float64(len(b)) / (rate * frame), true
		}
		if size < 0 || i+8+size+size%2 <= i {
			break
		}
		i += 8 + size + size%2
	}
	return 0, false
}

// flacSeconds reads a FLAC stream as a decoder does, frame by frame:
// each frame's header (found by its sync code, checked by its CRC-8) says
// how many samples it holds and at what rate. Its stream header's total,
// which a decoder does not need, counts only when it says more.
func flacSeconds(b []byte) (float64, bool) {
	if len(b) < 8+34 || b[4]&0x7F != 0 { // the first block is STREAMINFO
		return 0, false
	}
	v := binary.BigEndian.Uint64(b[8+10 : 8+18])
	streamRate := float64(v >> 44)
	var declared float64
	if total := float64(v & (1<<36 - 1)); streamRate >= 1 && total >= 1 {
		declared = total / streamRate
	}
	i := 4
	for i+4 <= len(b) { // past the metadata blocks
		last := b[i]&0x80 != 0
		i += 4 + (int(b[i+1])<<16 | int(b[i+2])<<8 | int(b[i+3]))
		if last {
			break
		}
	}
	seconds := max(flacFrameSeconds(b[min(i, len(b)):], streamRate), declared)
	return seconds, seconds > 0
}

// flacFrameSeconds adds up the FLAC frames in b, each found by its sync
// code and checked by its header's CRC-8: its samples over its rate (the
// stream's, streamRate, where the frame names none).
func flacFrameSeconds(b []byte, streamRate float64) float64 {
	var seconds float64
	for i := 0; i+6 <= len(b); i++ {
		if b[i] != 0xFF || b[i+1]&0xFE != 0xF8 {
			continue
		}
		if samples, rate, n := flacFrame(b[i:], streamRate); n > 0 {
			seconds += samples / rate
			i += n - 1
		}
	}
	return seconds
}

// flacFrame reads the FLAC frame header at the start of b: its samples,
// their rate and the header's length; 0 length when b holds none.
func flacFrame(b []byte, streamRate float64) (samples, rate float64, n int) {
	bs, sr := b[2]>>4, b[2]&15
	if bs == 0 || sr == 15 || b[3]>>4 > 10 || b[3]&1 != 0 || (b[3]>>1)&7 == 3 || (b[3]>>1)&7 == 7 {
		return 0, 0, 0
	}
	i := 4
	// The frame or sample number, UTF-8 coded in 1 to 7 bytes.
	switch c := b[i]; {
	case c < 0x80:
		i++
	case c >= 0xC0 && c < 0xFF:
		extra := 0
		for m := byte(0x40); c&m != 0 && extra < 6; m >>= 1 {
			extra++
		}
		i += 1 + extra
	default:
		return 0, 0, 0
	}
	need := 0 // the block size's and rate's bytes that follow
	switch bs {
	case 6:
		need++
	case 7:
		need += 2
	}
	switch sr {
	case 12:
		need++
	case 13, 14:
		need += 2
	}
	if i+need+1 > len(b) {
		return 0, 0, 0
	}
	switch {
	case bs == 1:
		samples = 192
	case bs <= 5:
		samples = float64(int(576) << (bs - 2))
	case bs == 6:
		samples = float64(b[i]) + 1
		i++
	case bs == 7:
		samples = float64(binary.BigEndian.Uint16(b[i:])) + 1
		i += 2
	default:
		samples = float64(int(256) << (bs - 8))
	}
	rates := [...]float64{0, 88200, 176400, 192000, 8000, 16000, 22050, 24000, 32000, 44100, 48000, 96000}
	switch {
	case sr == 0:
		rate = streamRate
	case sr < 12:
		rate = rates[sr]
	case sr == 12:
		rate = float64(b[i]) * 1000
		i++
	case sr == 13:
		rate = float64(binary.BigEndian.Uint16(b[i:]))
		i += 2
	default:
		rate = float64(binary.BigEndian.Uint16(b[i:])) * 10
		i += 2
	}
	if rate < 1 || crc8(b[:i]) != b[i] {
		return 0, 0, 0
	}
	return samples, rate, i + 1
}

// crc8 is FLAC's header checksum: polynomial x^8 + x^2 + x + 1.
func crc8(b []byte) byte {
	var c byte
	for _, x := range b {
		c ^= x
		for range 8 {
			if c&0x80 != 0 {
				c = c<<1 ^ 0x07
			} else {
				c <<= 1
			}
		}
	}
	return c
}

// oggSeconds reads an Ogg stream as a decoder does, packet by packet:
// an Opus packet's table of contents says how many frames of what length
// it holds; a Vorbis audio packet makes at most half its stream's long
// block. Its pages' granule positions, which a decoder does not need,
// count only where they say more.
func oggSeconds(b []byte) (float64, bool) {
	var (
		opus, vorbis    bool
		rate, halfBlock float64
		seconds         float64
		granule, gRate  float64
	)
	oggPackets(b, func(p []byte, g uint64) {
		switch {
		case bytes.HasPrefix(p, []byte("OpusHead")):
			opus, gRate = true, 48000
		case bytes.HasPrefix(p, []byte("\x01vorbis")) && len(p) >= 29:
			vorbis = true
			rate = float64(binary.LittleEndian.Uint32(p[12:16]))
			halfBlock = float64(int(1)<<(p[28]>>4)) / 2
			gRate = rate
		case bytes.HasPrefix(p, []byte("OpusTags")), len(p) > 0 && p[0]&1 == 1 && vorbis:
			// Headers, not audio.
		case opus && len(p) > 0:
			seconds += opusPacketSeconds(p)
		case vorbis && rate >= 1 && len(p) > 0:
			seconds += halfBlock / rate
		}
		if g != ^uint64(0) && gRate >= 1 {
			granule = max(granule, float64(g)/gRate)
		}
	})
	if !opus && !vorbis {
		return 0, false
	}
	seconds = max(seconds, granule)
	return seconds, seconds > 0
}

// oggPackets calls f with the start of each packet of the Ogg pages in b
// (its first bytes, within its page) and its page's granule position.
func oggPackets(b []byte, f func(p []byte, granule uint64)) {
	for i := 0; i+27 <= len(b); {
		if string(b[i:i+4]) != "OggS" {
			j := bytes.Index(b[i+1:], []byte("OggS"))
			if j < 0 {
				return
			}
			i += 1 + j
			continue
		}
		n := int(b[i+26])
		if i+27+n > len(b) {
			return
		}
		granule := binary.LittleEndian.Uint64(b[i+6 : i+14])
		pos := i + 27 + n
		starts := b[i+5]&1 == 0 // not the rest of a packet begun before
		for _, l := range b[i+27 : i+27+n] {
			if starts && pos < len(b) {
				f(b[pos:min(pos+int(l), len(b))], granule)
			}
			pos += int(l)
			starts = l < 255
		}
		i = pos
	}
}

// opusPacketSeconds is the length of an Opus packet by its table of
// contents: its frames times their length.
func opusPacketSeconds(p []byte) float64 {
	config := p[0] >> 3
	var frame float64 // milliseconds
	switch {
	case config < 12:
		frame = [...]float64{10, 20, 40, 60}[config%4]
	case config < 16:
		frame = [...]float64{10, 20}[config%2]
	default:
		frame = [...]float64{2.5, 5, 10, 20}[config%4]
	}
	frames := 1.0
	switch p[0] & 3 {
	case 1, 2:
		frames = 2
	case 3:
		if len(p) < 2 {
			return 0
		}
		frames = float64(p[1] & 0x3F)
	}
	return frames * frame / 1000
}

// mp3Seconds walks an MPEG audio stream frame by frame, as a decoder
// does: the samples of its frames over their rates. Bytes that are not a
// frame are skipped; a free-format frame is not read.
func mp3Seconds(b []byte) (float64, bool) {
	i := 0
	var seconds float64
	frames := 0
	for i+4 <= len(b) {
		h := binary.BigEndian.Uint32(b[i : i+4])
		length, samples, rate := mpegFrame(h)
		if length == 0 {
			i++
			continue
		}
		seconds += float64(samples) / float64(rate)
		frames++
		i += length
	}
	return seconds, frames > 0
}

// mpegFrame returns the length, samples and sample rate of the MPEG audio
// frame whose header is h, 0 when h is not one.
func mpegFrame(h uint32) (length, samples, rate int) {
	if h>>21 != 0x7FF {
		return 0, 0, 0
	}
	version := (h >> 19) & 3 // 0: 2.5, 2: 2, 3: 1
	layer := (h >> 17) & 3   // 1: III, 2: II, 3: I
	bitrateIdx := (h >> 12) & 15
	rateIdx := (h >> 10) & 3
	padding := int((h >> 9) & 1)
	if version == 1 || layer == 0 || bitrateIdx == 0 || bitrateIdx == 15 || rateIdx == 3 {
		return 0, 0, 0
	}
	rates := [3]int{44100, 48000, 32000}
	rate = rates[rateIdx]
	switch version {
	case 2:
		rate /= 2
	case 0:
		rate /= 4
	}
	v1 := version == 3
	var kbps int
	switch {
	case v1 && layer == 3:
		kbps = [...]int{0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448}[bitrateIdx]
	case v1 && layer == 2:
		kbps = [...]int{0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384}[bitrateIdx]
	case v1:
		kbps = [...]int{0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320}[bitrateIdx]
	case layer == 3:
		kbps = [...]int{0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256}[bitrateIdx]
	default:
		kbps = [...]int{0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160}[bitrateIdx]
	}
	switch {
	case layer == 3: // Layer I
		return (12*kbps*1000/rate + padding) * 4, 384, rate
	case layer == 2 || v1: // Layer II, or Layer III of MPEG-1
		return 144*kbps*1000/rate + padding, 1152, rate
	default: // Layer III of MPEG-2 and 2.5
		return 72*kbps*1000/rate + padding, 576, rate
	}
}

// PageTokens bounds the input tokens of one page of a PDF: Claude bills a
// page as its text and an image of it, 1,500 to 3,000 tokens; Gemini 258.
const PageTokens = 3000

// MaxPDFPages is the most pages of one PDF a provider reads (Claude's
// 100; Gemini bills at most 258 a page, so its 1,000 pages stay below
// this bound), for a PDF whose pages cannot be counted.
const MaxPDFPages = 100

// documentTokensJSON bounds the input tokens of one PDF, data its base64
// JSON string (quoted), nil for a PDF by URL or id: its pages times
// PageTokens, the pages counted as a reader finds them (its page
// objects); MaxPDFPages of them when they cannot be (page objects packed
// in compressed streams, a PDF not inline).
func documentTokensJSON(data []byte) int64 {
	if data == nil {
		return documentTokens(nil)
	}
	return documentTokens(unquote(data))
}

// documentTokens is documentTokensJSON of b64, the string's value.
func documentTokens(b64 []byte) int64 {
	pages := int64(MaxPDFPages)
	if b64 != nil {
		if b, err := decodeBase64(b64); err == nil {
			if n := pdfPages(b); n > 0 {
				pages = n
			}
		}
	}
	return pages * PageTokens
}

// pdfPages counts a PDF's pages as a reader does, down its page tree:
// every reference in a /Kids array (written in place or as an object of
// its own) is a page or a node of more, so a page listed twice, or a node
// shared by two parents, counts each time; and at least its page objects
// and the largest /Count it states. Of two /Kids of one object number (in
// a string, or in another object of that number a reader may not
// follow), the longer counts. 0 when it cannot tell: object
// streams (which may hold the tree) or a name written with # escapes.
func pdfPages(b []byte) int64 {
	if bytes.Contains(b, []byte("/ObjStm")) || escapedName.Match(b) {
		return 0
	}
	// Every occurrence of an object number counts: a reader follows
	// its cross-reference table to one of them, which a count here
	// cannot tell; the largest of what they say is the bound.
	bodies := map[int][][]byte{}
	objects := pdfObject.FindAllSubmatchIndex(b, -1)
	for i, m := range objects {
		num, _ := strconv.Atoi(string(b[m[2]:m[3]]))
		body := b[m[1]:]
		if i+1 < len(objects) {
			body = b[m[1]:objects[i+1][0]] // at most to the next object
		}
		if end := bytes.Index(body, []byte("endobj")); end >= 0 {
			body = body[:end]
		}
		bodies[num] = append(bodies[num], body)
	}
	refs := func(b []byte) []int {
		var out []int
		for _, r := range pdfRef.FindAllSubmatch(b, -1) {
			n, _ := strconv.Atoi(string(r[1]))
			out = append(out, n)
		}
		return out
	}
	kids := map[int][]int{} // a node's children, by object number
	var pages, stated int64
	for num, all := range bodies {
		for _, body := range all {
			if pageType.Match(body) {
				pages++
			}
			for _, c := range pdfCount.FindAllSubmatch(body, -1) {
				n, _ := strconv.ParseInt(string(c[1]), 10, 64)
				stated = max(stated, min(n, MaxPDFPages))
			}
			for _, k := range pdfKids.FindAllSubmatch(body, -1) {
				lists := [][]byte{k[1]}
				if k[2] != nil { // /Kids 5 0 R: the array is object 5
					n, _ := strconv.Atoi(string(k[2]))
					lists = bodies[n]
				}
				for _, list := range lists {
					if r := refs(list); len(r) > len(kids[num]) {
						kids[num] = r
					}
				}
			}
		}
	}
	child := map[int]bool{}
	for _, ks := range kids {
		for _, k := range ks {
			child[k] = true
		}
	}
	// Each root down, memoized; at most MaxPDFPages counted, past which
	// the bound is the same, and a cycle counts as that many.
	memo := map[int]int64{}
	var count func(n, depth int) int64
	count = func(n, depth int) int64 {
		ks, ok := kids[n]
		if !ok {
			return 1
		}
		if v, ok := memo[n]; ok {
			return v
		}
		if depth > 64 {
			return MaxPDFPages
		}
		memo[n] = MaxPDFPages // while counting: a cycle is the most
		var sum int64
		for _, k := range ks {
			if sum += count(k, depth+1); sum >= MaxPDFPages {
				break
			}
		}
		memo[n] = min(sum, MaxPDFPages)
		return memo[n]
	}
	var tree int64
	roots := 0
	for n := range kids {
		if !child[n] {
			tree += count(n, 0)
			roots++
		}
	}
	if roots == 0 && len(kids) > 0 {
		tree = MaxPDFPages // nodes that are all each other's children
	}
	return max(tree, pages, stated)
}

// The parts of a PDF pdfPages reads.
var (
	pdfObject   = regexp.MustCompile(`(\d+)\s+\d+\s+obj\b`)
	pdfKids     = regexp.MustCompile(`/Kids\s*(?:\[([^\]]*)\]|(\d+)\s+\d+\s*R)`)
	pdfRef      = regexp.MustCompile(`(\d+)\s+\d+\s*R`)
	pdfCount    = regexp.MustCompile(`/Count\s+(\d+)`)
	pageType    = regexp.MustCompile(`/Type\s*/Page\b`)
	escapedName = regexp.MustCompile(`/[A-Za-z]*#[0-9A-Fa-f]{2}`)
)

// tiledImageTokens bounds the input tokens of one inline image, b64 its
// base64 text, for a model that counts images in tiles of 768×768
// pixels, 258 tokens each (Gemini), read from the image's size (PNG,
// JPEG, GIF, WebP); at least MediaTokens, which bounds the models that
// scale an image down (GPT-4o, Claude).
func tiledImageTokens(b64 []byte) int64 {
	b, err := decodeBase64(b64)
	if err != nil {
		return MediaTokens
	}
	w, h, ok := imageSize(b)
	if !ok {
		return MediaTokens
	}
	tiles := ((w + 767) / 768) * ((h + 767) / 768)
	return max(min(tiles*258, MaxMediaTokens), MediaTokens)
}

// imageSize reads the width and height of a PNG, GIF, WebP or JPEG image.
func imageSize(b []byte) (w, h int64, ok bool) {
	switch {
	case len(b) >= 24 && string(b[1:4]) == "PNG":
		return int64(binary.BigEndian.Uint32(b[16:20])), int64(binary.BigEndian.Uint32(b[20:24])), true
	case len(b) >= 10 && string(b[0:3]) == "GIF":
		return int64(binary.LittleEndian.Uint16(b[6:8])), int64(binary.LittleEndian.Uint16(b[8:10])), true
	case len(b) >= 30 && string(b[0:4]) == "RIFF" && string(b[8:12]) == "WEBP":
		switch string(b[12:16]) {
		case "VP8X":
			return 1 + int64(b[24]) | int64(b[25])<<8 | int64(b[26])<<16, 1 + int64(b[27]) | int64(b[28])<<8 | int64(b[29])<<16, true
		case "VP8 ":
			return int64(binary.LittleEndian.Uint16(b[26:28]) & 0x3FFF), int64(binary.LittleEndian.Uint16(b[28:30]) & 0x3FFF), true
		case "VP8L":
			v := binary.LittleEndian.Uint32(b[21:25])
			return int64(v&0x3FFF) + 1, int64(v>>14&0x3FFF) + 1, true
		}
	case len(b) >= 4 && b[0] == 0xFF && b[1] == 0xD8:
		// The frame header (SOF0–SOF15 but DHT, JPG and DAC) holds the size.
		for i := 2; i+9 < len(b); {
			if b[i] != 0xFF {
				return 0, 0, false
			}
			m := b[i+1]
			if m == 0xFF {
				i++
				continue
			}
			size := int(binary.BigEndian.Uint16(b[i+2 : i+4]))
			if m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC {
				return int64(binary.BigEndian.Uint16(b[i+7 : i+9])), int64(binary.BigEndian.Uint16(b[i+5 : i+7])), true
			}
			i += 2 + size
		}
	}
	return 0, 0, false
}
