package launcher

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxExpandedHosts bounds what ExpandHostlist and ExpandTasksPerNode
// produce: an expression that expands to more entries fails instead of
// exhausting memory.
const MaxExpandedHosts = 1 << 20

// maxExpandedBytes bounds the total length of the names ExpandHostlist
// returns (zero padding can make each name as long as the expression).
const maxExpandedBytes = 64 << 20

// ExpandHostlist expands a Slurm hostlist expression, such as the value of
// SLURM_JOB_NODELIST, into host names in the order that
// `scontrol show hostnames` prints them.
//
// Names are separated by commas or whitespace outside brackets; empty names
// are skipped. A bracket holds a comma-separated list of numbers and ranges,
// "node[01-04,07]"; every number is zero-padded to the width of the range's
// lower bound as written, so "n[008-011]" gives n008 n009 n010 n011 and
// "n[9-11]" gives n9 n10 n11. Duplicates are kept, in order.
//
// A name may hold several bracket groups. Slurm's order is not plain
// lexicographic: the last group varies fastest, and the other groups are
// looped from the second-to-last (slowest) back to the first, so
// "r[1-2]n[1-2]" gives r1n1 r1n2 r2n1 r2n2, but "x[1-2]y[3-4]z[5-6]" gives
// x1y3z5 x1y3z6 x2y3z5 x2y3z6 x1y4z5 and so on. ExpandHostlist reproduces it.
//
// ExpandHostlist is stricter than Slurm 22.05 where Slurm silently accepts
// nonsense: unbalanced or nested brackets, empty or reversed ranges,
// signs or whitespace inside brackets and an expression with no names are
// errors. It also accepts text after the last bracket ("a[1-2]-ib"), which
// Slurm 22.05 rejects. The result is capped at MaxExpandedHosts names.
func ExpandHostlist(expr string) ([]string, error) {
	fail := func(format string, args ...any) ([]string, error) {
		return nil, fmt.Errorf("launcher: hostlist %q: %s", expr, fmt.Sprintf(format, args...))
	}
	tokens, err := splitHostlist(expr)
	if err != nil {
		return fail("%v", err)
	}
	if len(tokens) == 0 {
		return fail("no host names")
	}
	var hosts []string
	size := 0
	for _, tok := range tokens {
		p, err := parseHostPattern(tok)
		if err != nil {
			if tok == strings.TrimSpace(expr) {
				return fail("%v", err)
			}
			return fail("%q: %v", tok, err)
		}
		n := p.count()
		if n > MaxExpandedHosts-len(hosts) {
			return fail("expands to more than %d hosts", MaxExpandedHosts)
		}
		// The size is known before any name is made, so that a pattern
		// near the caps costs arithmetic, not a million allocations.
		bytes := p.size(n)
		if bytes > maxExpandedBytes-size {
			return fail("expands to more than %d bytes", maxExpandedBytes)
		}
		size += bytes
		hosts = p.appendNames(hosts, n, bytes)
	}
	return hosts, nil
}

// splitHostlist cuts expr at commas and whitespace outside brackets,
// dropping empty tokens, and checks that brackets balance and do not nest.
func splitHostlist(expr string) ([]string, error) {
	var tokens []string
	start, depth := 0, 0
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; {
		case c == '[':
			if depth > 0 {
				return nil, fmt.Errorf("nested '[' at offset %d", i)
			}
			depth++
		case c == ']':
			if depth == 0 {
				return nil, fmt.Errorf("unbalanced ']' at offset %d", i)
			}
			depth--
		case depth == 0 && (c == ',' || isSpace(c)):
			if i > start {
				tokens = append(tokens, expr[start:i])
			}
			start = i + 1
		}
	}
	if depth > 0 {
		return nil, errors.New("unbalanced '[': missing ']'")
	}
	if start < len(expr) {
		tokens = append(tokens, expr[start:])
	}
	return tokens, nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// numRange is lo-hi inclusive, each number printed zero-padded to width.
type numRange struct {
	lo, hi uint64
	width  int
}

// hostPattern is lits[0] groups[0] lits[1] groups[1] ... lits[n]: one name
// with n bracket groups (len(lits) == len(groups)+1).
type hostPattern struct {
	lits   []string
	groups [][]numRange
}

func parseHostPattern(tok string) (hostPattern, error) {
	var p hostPattern
	for {
		open := strings.IndexByte(tok, '[')
		if open < 0 {
			p.lits = append(p.lits, tok)
			return p, nil
		}
		end := strings.IndexByte(tok, ']') // splitHostlist checked the balance
		ranges, err := parseRanges(tok[open+1 : end])
		if err != nil {
			return hostPattern{}, err
		}
		p.lits = append(p.lits, tok[:open])
		p.groups = append(p.groups, ranges)
		tok = tok[end+1:]
	}
}

// parseRanges parses the inside of a bracket: "01-04,07".
func parseRanges(s string) ([]numRange, error) {
	if s == "" {
		return nil, errors.New("empty brackets")
	}
	var ranges []numRange
	for item := range strings.SplitSeq(s, ",") {
		loText, hiText, isRange := strings.Cut(item, "-")
		lo, err := parseBound(loText)
		if err != nil {
			return nil, fmt.Errorf("range %q: %w", item, err)
		}
		hi := lo
		if isRange {
			if hi, err = parseBound(hiText); err != nil {
				return nil, fmt.Errorf("range %q: %w", item, err)
			}
		}
		if lo > hi {
			return nil, fmt.Errorf("range %q is reversed", item)
		}
		if hi-lo >= MaxExpandedHosts {
			return nil, fmt.Errorf("range %q has more than %d hosts", item, MaxExpandedHosts)
		}
		ranges = append(ranges, numRange{lo: lo, hi: hi, width: len(loText)})
	}
	return ranges, nil
}

func parseBound(s string) (uint64, error) {
	if s == "" {
		return 0, errors.New("missing number")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a number", s)
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return n, nil
}

// count is how many names p expands to, saturated at MaxExpandedHosts+1.
func (p hostPattern) count() int {
	total := 1
	for _, g := range p.groups {
		n := 0
		for _, r := range g {
			n += int(r.hi-r.lo) + 1 // parseRanges bounds each range
			if n > MaxExpandedHosts {
				return MaxExpandedHosts + 1
			}
		}
		total *= n
		if total > MaxExpandedHosts {
			return MaxExpandedHosts + 1
		}
	}
	return total
}

// size is the bytes of p's n names together, saturated above
// maxExpandedBytes: every name holds every literal, and each number of a
// group appears n/(the group's count) times.
func (p hostPattern) size(n int) int {
	total := 0
	for _, lit := range p.lits {
		total += len(lit)
	}
	total = satMul(total, n)
	for _, g := range p.groups {
		count, digits := 0, 0
		for _, r := range g {
			count += int(r.hi-r.lo) + 1
			digits = satAdd(digits, rangeDigits(r))
		}
		total = satAdd(total, satMul(digits, n/count))
	}
	return total
}

// rangeDigits is the bytes of r's numbers, each padded to r.width.
func rangeDigits(r numRange) int {
	total := 0
	lo := r.lo
	for d, pow := 1, uint64(1); ; d, pow = d+1, pow*10 {
		// The numbers of d digits are [pow, pow*10-1] (0 has one digit).
		next := pow * 10
		if d == 20 || r.hi < next {
			return satAdd(total, satMul(max(d, r.width), int(r.hi-lo+1)))
		}
		if lo < next {
			total = satAdd(total, satMul(max(d, r.width), int(next-lo)))
			lo = next
		}
	}
}

func satAdd(a, b int) int { return min(a+b, maxExpandedBytes+1) }

func satMul(a, n int) int {
	if n != 0 && a > (maxExpandedBytes+1)/n {
		return maxExpandedBytes + 1
	}
	return min(a*n, maxExpandedBytes+1)
}

// appendNames appends p's n names, of size bytes together, in Slurm's
// order: the last group innermost, and the others outermost first from
// the second-to-last back to the first. The names share one string.
func (p hostPattern) appendNames(hosts []string, n, size int) []string {
	groups := len(p.groups)
	order := make([]int, 0, groups)
	for i := groups - 2; i >= 0; i-- {
		order = append(order, i)
	}
	if groups > 0 {
		order = append(order, groups-1)
	}
	hosts = slices.Grow(hosts, n)
	buf := make([]byte, 0, size)
	ends := make([]int, 0, n)
	values := make([]uint64, groups)
	widths := make([]int, groups)
	var walk func(depth int)
	walk = func(depth int) {
		if depth == len(order) {
			for i, lit := range p.lits {
				buf = append(buf, lit...)
				if i < groups {
					buf = appendPadded(buf, values[i], widths[i])
				}
			}
			ends = append(ends, len(buf))
			return
		}
		g := order[depth]
		for _, r := range p.groups[g] {
			widths[g] = r.width
			for v := r.lo; ; v++ {
				values[g] = v
				walk(depth + 1)
				if v == r.hi {
					break
				}
			}
		}
	}
	walk(0)
	all, start := string(buf), 0
	for _, end := range ends {
		hosts = append(hosts, all[start:end])
		start = end
	}
	return hosts
}

// appendPadded appends v in decimal, zero-padded to width.
func appendPadded(buf []byte, v uint64, width int) []byte {
	var digits [20]byte
	s := strconv.AppendUint(digits[:0], v, 10)
	for range width - len(s) {
		buf = append(buf, '0')
	}
	return append(buf, s...)
}

// ExpandTasksPerNode expands Slurm's run-length per-node counts, as in
// SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE and
// SLURM_JOB_CPUS_PER_NODE: "2(x3),1" is [2 2 2 1]. Every count must be a
// positive integer, every repeat at least 1, and the result has at most
// MaxExpandedHosts entries.
func ExpandTasksPerNode(spec string) ([]int, error) {
	fail := func(format string, args ...any) ([]int, error) {
		return nil, fmt.Errorf("launcher: tasks per node %q: %s", spec, fmt.Sprintf(format, args...))
	}
	if strings.TrimSpace(spec) == "" {
		return fail("empty")
	}
	var counts []int
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		value, repeat := item, "1"
		if head, rest, ok := strings.Cut(item, "("); ok {
			r, ok := strings.CutPrefix(rest, "x")
			if !ok || !strings.HasSuffix(r, ")") {
				return fail("%q: want N or N(xM)", item)
			}
			value, repeat = head, strings.TrimSuffix(r, ")")
		}
		n, err := parsePositive(value)
		if err != nil {
			return fail("%q: count %v", item, err)
		}
		m, err := parsePositive(repeat)
		if err != nil {
			return fail("%q: repeat %v", item, err)
		}
		if m > MaxExpandedHosts-len(counts) {
			return fail("expands to more than %d nodes", MaxExpandedHosts)
		}
		for range m {
			counts = append(counts, n)
		}
	}
	return counts, nil
}

// parsePositive parses a decimal integer of at least 1 written with digits
// only (no sign, no spaces).
func parsePositive(s string) (int, error) {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a positive integer", s)
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%q is not a positive integer", s)
	}
	return n, nil
}
