package launcher

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Host is one machine to launch workers on.
type Host struct {
	// Name is the host name or address as written, an IPv6 address
	// without its brackets ("::1").
	Name string
	// Slots is how many workers the host runs.
	Slots int
	// DefaultSlots reports that the entry named no count and Slots is the
	// default given to the parser, which the host itself may know better
	// (--nproc-per-node auto counts its own GPUs).
	DefaultSlots bool
	// GPUs are the device ids the host's workers use, one per slot, when a
	// selection (SelectHosts) pinned them; nil means "0 to Slots-1".
	GPUs []int
}

// HostSpecError is a bad entry in a hostfile or a host list.
type HostSpecError struct {
	File string // the hostfile's name; "" for a host list (ParseHostList)
	Line int    // 1-based line in File, or entry in a host list
	Text string // the entry, without its comment
	Err  error  // what is wrong with it
}

func (e *HostSpecError) Error() string {
	if e.File == "" {
		return fmt.Sprintf("launcher: host list entry %d: %q: %v", e.Line, e.Text, e.Err)
	}
	return fmt.Sprintf("launcher: %s:%d: %q: %v", e.File, e.Line, e.Text, e.Err)
}

func (e *HostSpecError) Unwrap() error { return e.Err }

// maxHostfileLine bounds one hostfile line.
const maxHostfileLine = 64 << 10

var errSlots = errors.New("slots must be a positive integer")

// ParseHostfile reads a hostfile in any of the usual forms, one host per
// line:
//
//	node1 slots=8            # OpenMPI, DeepSpeed (max_slots= is checked, then ignored)
//	node2:8                  # MPICH
//	node3                    # plain: defaultSlots
//	[fe80::1%eth0]:4         # IPv6 in brackets, in any of the forms above
//
// "#" starts a comment, on a line of its own or after an entry; blank lines
// are skipped. name is the file's name, used in errors. A bad line (a slot
// count that is not a positive integer, an unknown key, a stray word, a host
// named twice) fails the whole parse with a *HostSpecError naming the file,
// the line number and the line, and no hosts are returned. A file without
// hosts is an error too.
func ParseHostfile(r io.Reader, name string, defaultSlots int) ([]Host, error) {
	if defaultSlots < 1 {
		return nil, fmt.Errorf("launcher: %s: default slots %d is not positive", name, defaultSlots)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, maxHostfileLine)
	var hosts []Host
	firstLine := map[string]int{}
	for lineNo := 1; sc.Scan(); lineNo++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		h, err := parseHostfileLine(text, defaultSlots)
		if err == nil {
			if first, dup := firstLine[h.Name]; dup {
				err = fmt.Errorf("duplicate host %q (first on line %d)", h.Name, first)
			}
		}
		if err != nil {
			return nil, &HostSpecError{File: name, Line: lineNo, Text: text, Err: err}
		}
		firstLine[h.Name] = lineNo
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("launcher: read %s: %w", name, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("launcher: %s: no hosts", name)
	}
	return hosts, nil
}

func parseHostfileLine(text string, defaultSlots int) (Host, error) {
	fields := strings.Fields(text)
	h, err := parseHostEntry(fields[0], defaultSlots)
	if err != nil {
		return Host{}, err
	}
	maxSlots := 0
	for _, f := range fields[1:] {
		key, value, ok := strings.Cut(f, "=")
		if !ok {
			return Host{}, fmt.Errorf("%q is not key=value", f)
		}
		switch key {
		case "slots":
			if !h.DefaultSlots {
				return Host{}, errors.New("slots given twice")
			}
			n, err := parsePositive(value)
			if err != nil {
				return Host{}, errSlots
			}
			h.Slots, h.DefaultSlots = n, false
		case "max_slots", "max-slots":
			if maxSlots != 0 {
				return Host{}, errors.New("max_slots given twice")
			}
			n, err := parsePositive(value)
			if err != nil {
				return Host{}, errors.New("max_slots must be a positive integer")
			}
			maxSlots = n
		default:
			return Host{}, fmt.Errorf("unknown key %q (want slots or max_slots)", key)
		}
	}
	if maxSlots != 0 && !h.DefaultSlots && maxSlots < h.Slots {
		return Host{}, fmt.Errorf("max_slots %d is less than slots %d", maxSlots, h.Slots)
	}
	return h, nil
}

// parseHostEntry parses "host", "host:N", "[v6]" or "[v6]:N"; without N,
// the host has defaultSlots (Host.DefaultSlots).
func parseHostEntry(entry string, defaultSlots int) (Host, error) {
	name, slots, slotsGiven := entry, "", false
	if rest, ok := strings.CutPrefix(entry, "["); ok {
		addr, after, ok := strings.Cut(rest, "]")
		if !ok {
			return Host{}, errors.New("missing ']'")
		}
		if a, err := netip.ParseAddr(addr); err != nil || !a.Is6() {
			return Host{}, fmt.Errorf("%q in brackets is not an IPv6 address", addr)
		}
		name = addr
		if after != "" {
			s, ok := strings.CutPrefix(after, ":")
			if !ok {
				return Host{}, fmt.Errorf("unexpected %q after ']'", after)
			}
			slots, slotsGiven = s, true
		}
	} else {
		if strings.Count(entry, ":") > 1 {
			return Host{}, errors.New("an IPv6 address must be in brackets, as [::1]:4")
		}
		name, slots, slotsGiven = strings.Cut(entry, ":")
		if err := checkHostName(name); err != nil {
			return Host{}, err
		}
	}
	h := Host{Name: name, Slots: defaultSlots, DefaultSlots: !slotsGiven}
	if slotsGiven {
		n, err := parsePositive(slots)
		if err != nil {
			return Host{}, errSlots
		}
		h.Slots = n
	}
	return h, nil
}

func checkHostName(name string) error {
	if name == "" {
		return errors.New("empty host name")
	}
	if i := strings.IndexFunc(name, func(r rune) bool {
		return strings.ContainsRune("[]@,=:#", r) || r <= ' ' || r == 0x7f
	}); i >= 0 {
		return fmt.Errorf("host name %q contains %q", name, name[i])
	}
	return nil
}

// ParseHostList parses a --hosts value such as "a:8,b:8": comma-separated
// entries of the form "host", "host:N", "[v6]" or "[v6]:N" (defaultSlots
// when N is missing), with the same rules as a hostfile line. A bad entry,
// an empty one or a host named twice fails with a *HostSpecError giving the
// entry's 1-based position.
func ParseHostList(spec string, defaultSlots int) ([]Host, error) {
	if defaultSlots < 1 {
		return nil, fmt.Errorf("launcher: host list: default slots %d is not positive", defaultSlots)
	}
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New("launcher: host list: no hosts")
	}
	var hosts []Host
	first := map[string]int{}
	for i, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		var h Host
		var err error
		if entry == "" {
			err = errors.New("empty entry")
		} else if h, err = parseHostEntry(entry, defaultSlots); err == nil {
			if at, dup := first[h.Name]; dup {
				err = fmt.Errorf("duplicate host %q (first at entry %d)", h.Name, at)
			}
		}
		if err != nil {
			return nil, &HostSpecError{Line: i + 1, Text: entry, Err: err}
		}
		first[h.Name] = i + 1
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// SelectHosts applies a DeepSpeed-style --include or --exclude filter to
// hosts. A filter is "@"-separated entries "host" or "host:id,id,...",
// where the ids are GPU ids on that host (its GPUs, or 0 to Slots-1 when it
// has none pinned):
//
//   - include keeps only the hosts named, in hosts' order. A host given with
//     ids runs one worker per id: GPUs is the sorted ids and Slots their
//     count. A host given alone is kept as it is.
//   - exclude removes the hosts named alone, and the listed GPU ids from the
//     others (which then get GPUs pinned to what is left); a host left with
//     no GPU is removed.
//
// A host or id that is not in hosts, a host or id named twice, both filters
// at once, or a selection that leaves no host is an error. With neither
// filter SelectHosts returns a copy of hosts. The result never shares
// memory with hosts.
func SelectHosts(hosts []Host, include, exclude string) ([]Host, error) {
	if include != "" && exclude != "" {
		return nil, errors.New("launcher: include and exclude are mutually exclusive")
	}
	if include == "" && exclude == "" {
		return cloneHosts(hosts), nil
	}
	which, spec := "include", include
	if exclude != "" {
		which, spec = "exclude", exclude
	}
	fail := func(format string, args ...any) ([]Host, error) {
		return nil, fmt.Errorf("launcher: %s %q: %s", which, spec, fmt.Sprintf(format, args...))
	}
	index := make(map[string]int, len(hosts))
	for i, h := range hosts {
		index[h.Name] = i
	}
	// chosen[i]: host i is named; ids[i]: its ids, nil when named alone.
	chosen := make([]bool, len(hosts))
	ids := make([][]int, len(hosts))
	for entry := range strings.SplitSeq(spec, "@") {
		name, list, err := splitFilterEntry(entry)
		if err != nil {
			return fail("%q: %v", entry, err)
		}
		i, ok := index[name]
		if !ok {
			return fail("unknown host %q", name)
		}
		if chosen[i] {
			return fail("host %q named twice", name)
		}
		chosen[i] = true
		if list == nil {
			continue
		}
		avail := hostGPUs(hosts[i])
		for _, s := range list {
			id, err := strconv.Atoi(s)
			if err != nil || id < 0 || strings.TrimLeft(s, "0123456789") != "" {
				return fail("host %q: GPU id %q is not a non-negative integer", name, s)
			}
			if !slices.Contains(avail, id) {
				return fail("host %q has no GPU %d", name, id)
			}
			if slices.Contains(ids[i], id) {
				return fail("host %q: GPU %d named twice", name, id)
			}
			ids[i] = append(ids[i], id)
		}
		slices.Sort(ids[i])
	}
	var out []Host
	for i, h := range hosts {
		h.GPUs = slices.Clone(h.GPUs)
		switch {
		case include != "" && !chosen[i]:
			continue
		case include != "" && ids[i] != nil:
			h.GPUs, h.Slots, h.DefaultSlots = ids[i], len(ids[i]), false
		case exclude != "" && chosen[i] && ids[i] == nil:
			continue
		case exclude != "" && chosen[i]:
			left := slices.DeleteFunc(hostGPUs(h), func(id int) bool { return slices.Contains(ids[i], id) })
			if len(left) == 0 {
				continue
			}
			h.GPUs, h.Slots, h.DefaultSlots = left, len(left), false
		}
		out = append(out, h)
	}
	if len(out) == 0 {
		return fail("leaves no hosts")
	}
	return out, nil
}

// splitFilterEntry splits "host" or "host:0,1" ("[v6]:0,1" for IPv6);
// list is nil for a host alone.
func splitFilterEntry(entry string) (name string, list []string, err error) {
	rest := entry
	if r, ok := strings.CutPrefix(entry, "["); ok {
		var found bool
		if name, rest, found = strings.Cut(r, "]"); !found {
			return "", nil, errors.New("missing ']'")
		}
		if rest != "" && rest[0] != ':' {
			return "", nil, fmt.Errorf("unexpected %q after ']'", rest)
		}
	} else {
		if strings.Count(entry, ":") > 1 {
			return "", nil, errors.New("an IPv6 address must be in brackets, as [::1]:0,1")
		}
		name, _, _ = strings.Cut(entry, ":")
		rest = entry[len(name):]
	}
	if name == "" {
		return "", nil, errors.New("empty host name")
	}
	if rest == "" {
		return name, nil, nil
	}
	rest = rest[1:] // the ':'
	if rest == "" {
		return "", nil, errors.New("no GPU ids after ':'")
	}
	return name, strings.Split(rest, ","), nil
}

// hostGPUs is a fresh slice of h's GPU ids.
func hostGPUs(h Host) []int {
	if h.GPUs != nil {
		return slices.Clone(h.GPUs)
	}
	ids := make([]int, h.Slots)
	for i := range ids {
		ids[i] = i
	}
	return ids
}

func cloneHosts(hosts []Host) []Host {
	out := slices.Clone(hosts)
	for i := range out {
		out[i].GPUs = slices.Clone(out[i].GPUs)
	}
	return out
}
