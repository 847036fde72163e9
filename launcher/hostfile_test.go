package launcher

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func TestParseHostfile(t *testing.T) {
	f, err := os.Open("testdata/hostfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := ParseHostfile(f, "testdata/hostfile", 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []Host{
		{Name: "node1", Slots: 8},
		{Name: "node2", Slots: 4},
		{Name: "node3", Slots: 2},
		{Name: "node4", Slots: 3, DefaultSlots: true},
		{Name: "10.0.0.5", Slots: 1},
		{Name: "::1", Slots: 4},
		{Name: "fe80::1%eth0", Slots: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseHostfile = %+v\nwant %+v", got, want)
	}
}

func TestParseHostfileForms(t *testing.T) {
	tests := []struct {
		name, text string
		want       []Host
	}{
		{"deepspeed", "worker-1 slots=4\nworker-2 slots=4\n", []Host{{Name: "worker-1", Slots: 4}, {Name: "worker-2", Slots: 4}}},
		{"openmpi max_slots", "a slots=2 max_slots=2\nb max-slots=9\n", []Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 1, DefaultSlots: true}}},
		{"mpich", "a:2\nb:16\n", []Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 16}}},
		{"plain", "a\nb\n", []Host{{Name: "a", Slots: 1, DefaultSlots: true}, {Name: "b", Slots: 1, DefaultSlots: true}}},
		{"comments and blanks", "# head\n\n  \na # tail\n\t#indented\nb:2#tight\n", []Host{{Name: "a", Slots: 1, DefaultSlots: true}, {Name: "b", Slots: 2}}},
		{"crlf and no final newline", "a slots=2\r\nb", []Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 1, DefaultSlots: true}}},
		{"ipv6", "[::1]:4\n[2001:db8::2]\n[2001:db8::3] slots=2\n", []Host{{Name: "::1", Slots: 4}, {Name: "2001:db8::2", Slots: 1, DefaultSlots: true}, {Name: "2001:db8::3", Slots: 2}}},
	}
	for _, tt := range tests {
		got, err := ParseHostfile(strings.NewReader(tt.text), "hosts", 1)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: ParseHostfile = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestParseHostfileErrors(t *testing.T) {
	tests := []struct {
		text string
		want string // the whole message
	}{
		{"node1 slots=2\n# c\nnode2 slots=x\n", `launcher: hosts:3: "node2 slots=x": slots must be a positive integer`},
		{"node1 slots=0\n", `launcher: hosts:1: "node1 slots=0": slots must be a positive integer`},
		{"node1 slots=-2\n", `launcher: hosts:1: "node1 slots=-2": slots must be a positive integer`},
		{"node1 slots=+2\n", `launcher: hosts:1: "node1 slots=+2": slots must be a positive integer`},
		{"node1 slots=\n", `launcher: hosts:1: "node1 slots=": slots must be a positive integer`},
		{"\nhost:abc # bad\n", `launcher: hosts:2: "host:abc": slots must be a positive integer`},
		{"host:\n", `launcher: hosts:1: "host:": slots must be a positive integer`},
		{"a b c\n", `launcher: hosts:1: "a b c": "b" is not key=value`},
		{"a slots=2 gpus=4\n", `launcher: hosts:1: "a slots=2 gpus=4": unknown key "gpus" (want slots or max_slots)`},
		{"a:2 slots=2\n", `launcher: hosts:1: "a:2 slots=2": slots given twice`},
		{"a slots=1 slots=2\n", `launcher: hosts:1: "a slots=1 slots=2": slots given twice`},
		{"a slots=4 max_slots=2\n", `launcher: hosts:1: "a slots=4 max_slots=2": max_slots 2 is less than slots 4`},
		{"a max_slots=x\n", `launcher: hosts:1: "a max_slots=x": max_slots must be a positive integer`},
		{"a\nb\na:2\n", `launcher: hosts:3: "a:2": duplicate host "a" (first on line 1)`},
		{"::1\n", `launcher: hosts:1: "::1": an IPv6 address must be in brackets, as [::1]:4`},
		{"[::1\n", `launcher: hosts:1: "[::1": missing ']'`},
		{"[node1]:2\n", `launcher: hosts:1: "[node1]:2": "node1" in brackets is not an IPv6 address`},
		{"[::1]x\n", `launcher: hosts:1: "[::1]x": unexpected "x" after ']'`},
		{":4\n", `launcher: hosts:1: ":4": empty host name`},
		{"a,b\n", `launcher: hosts:1: "a,b": host name "a,b" contains ','`},
		{"slots=4\n", `launcher: hosts:1: "slots=4": host name "slots=4" contains '='`},
		{"# only comments\n\n", `launcher: hosts: no hosts`},
		{"", `launcher: hosts: no hosts`},
	}
	for _, tt := range tests {
		got, err := ParseHostfile(strings.NewReader(tt.text), "hosts", 1)
		if err == nil || got != nil {
			t.Errorf("ParseHostfile(%q) = %+v, %v; want nothing and an error", tt.text, got, err)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ParseHostfile(%q) error\n %s\nwant\n %s", tt.text, err, tt.want)
		}
	}

	_, err := ParseHostfile(strings.NewReader("a\nb slots=x\n"), "hosts", 1)
	var se *HostSpecError
	if !errors.As(err, &se) || se.File != "hosts" || se.Line != 2 || se.Text != "b slots=x" {
		t.Errorf("error %#v is not the HostSpecError for line 2", err)
	}
	if !errors.Is(err, errSlots) {
		t.Errorf("errors.Is(%v, errSlots) = false", err)
	}

	if _, err := ParseHostfile(strings.NewReader("a\n"), "hosts", 0); err == nil {
		t.Error("ParseHostfile with default slots 0: no error")
	}
	long := strings.Repeat("x", maxHostfileLine+1)
	if _, err := ParseHostfile(strings.NewReader(long), "hosts", 1); err == nil || !strings.HasPrefix(err.Error(), "launcher: read hosts: ") {
		t.Errorf("ParseHostfile of an overlong line: %v", err)
	}
}

func TestParseHostList(t *testing.T) {
	tests := []struct {
		spec string
		want []Host
	}{
		{"a:8,b:8", []Host{{Name: "a", Slots: 8}, {Name: "b", Slots: 8}}},
		{"a", []Host{{Name: "a", Slots: 2, DefaultSlots: true}}},
		{" a:1 , b ", []Host{{Name: "a", Slots: 1}, {Name: "b", Slots: 2, DefaultSlots: true}}},
		{"[::1]:4,127.0.0.1:3,[fe80::2]", []Host{{Name: "::1", Slots: 4}, {Name: "127.0.0.1", Slots: 3}, {Name: "fe80::2", Slots: 2, DefaultSlots: true}}},
	}
	for _, tt := range tests {
		got, err := ParseHostList(tt.spec, 2)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseHostList(%q) = %+v, %v; want %+v", tt.spec, got, err, tt.want)
		}
	}
	bad := []struct{ spec, want string }{
		{"", `launcher: host list: no hosts`},
		{"a:8,b:x", `launcher: host list entry 2: "b:x": slots must be a positive integer`},
		{"a:0", `launcher: host list entry 1: "a:0": slots must be a positive integer`},
		{"a,,b", `launcher: host list entry 2: "": empty entry`},
		{"a,", `launcher: host list entry 2: "": empty entry`},
		{"a:1,b,a:2", `launcher: host list entry 3: "a:2": duplicate host "a" (first at entry 1)`},
		{"a slots=2", `launcher: host list entry 1: "a slots=2": host name "a slots=2" contains ' '`},
		{"fe80::1", `launcher: host list entry 1: "fe80::1": an IPv6 address must be in brackets, as [::1]:4`},
	}
	for _, tt := range bad {
		got, err := ParseHostList(tt.spec, 2)
		if err == nil || got != nil {
			t.Errorf("ParseHostList(%q) = %+v, %v; want nothing and an error", tt.spec, got, err)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ParseHostList(%q) error\n %s\nwant\n %s", tt.spec, err, tt.want)
		}
	}
}

func TestSelectHosts(t *testing.T) {
	hosts := []Host{{Name: "h1", Slots: 4}, {Name: "h2", Slots: 2}, {Name: "::1", Slots: 2}, {Name: "h4", Slots: 3, GPUs: []int{1, 5, 7}}}
	tests := []struct {
		name, include, exclude string
		want                   []Host
	}{
		{"no filter", "", "", hosts},
		{"include hosts", "h2@h1", "", []Host{{Name: "h1", Slots: 4}, {Name: "h2", Slots: 2}}},
		{"include gpus", "h1:0,1@h2:1", "", []Host{{Name: "h1", Slots: 2, GPUs: []int{0, 1}}, {Name: "h2", Slots: 1, GPUs: []int{1}}}},
		{"include sorts gpus", "h1:3,0", "", []Host{{Name: "h1", Slots: 2, GPUs: []int{0, 3}}}},
		{"include ipv6", "[::1]:1", "", []Host{{Name: "::1", Slots: 1, GPUs: []int{1}}}},
		{"include pinned", "h4:7,5", "", []Host{{Name: "h4", Slots: 2, GPUs: []int{5, 7}}}},
		{"include pinned host alone", "h4", "", []Host{{Name: "h4", Slots: 3, GPUs: []int{1, 5, 7}}}},
		{"exclude host", "", "h2@[::1]", []Host{{Name: "h1", Slots: 4}, {Name: "h4", Slots: 3, GPUs: []int{1, 5, 7}}}},
		{"exclude gpus", "", "h1:0,2@h4:5", []Host{{Name: "h1", Slots: 2, GPUs: []int{1, 3}}, {Name: "h2", Slots: 2}, {Name: "::1", Slots: 2}, {Name: "h4", Slots: 2, GPUs: []int{1, 7}}}},
		{"exclude every gpu drops the host", "", "h2:0,1@[::1]", []Host{{Name: "h1", Slots: 4}, {Name: "h4", Slots: 3, GPUs: []int{1, 5, 7}}}},
	}
	for _, tt := range tests {
		got, err := SelectHosts(hosts, tt.include, tt.exclude)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: SelectHosts = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
	if hosts[3].GPUs[0] != 1 || len(hosts) != 4 {
		t.Errorf("SelectHosts changed its input: %+v", hosts)
	}
	got, _ := SelectHosts(hosts, "", "")
	got[3].GPUs[0] = 99
	if hosts[3].GPUs[0] != 1 {
		t.Error("SelectHosts result shares GPUs with its input")
	}

	bad := []struct{ include, exclude, want string }{
		{"h1", "h2", `launcher: include and exclude are mutually exclusive`},
		{"h9", "", `launcher: include "h9": unknown host "h9"`},
		{"", "h1@h9:0", `launcher: exclude "h1@h9:0": unknown host "h9"`},
		{"h1:4", "", `launcher: include "h1:4": host "h1" has no GPU 4`},
		{"h4:0", "", `launcher: include "h4:0": host "h4" has no GPU 0`},
		{"h1:x", "", `launcher: include "h1:x": host "h1": GPU id "x" is not a non-negative integer`},
		{"h1:-1", "", `launcher: include "h1:-1": host "h1": GPU id "-1" is not a non-negative integer`},
		{"h1:+1", "", `launcher: include "h1:+1": host "h1": GPU id "+1" is not a non-negative integer`},
		{"h1:0,,1", "", `launcher: include "h1:0,,1": host "h1": GPU id "" is not a non-negative integer`},
		{"h1:1,1", "", `launcher: include "h1:1,1": host "h1": GPU 1 named twice`},
		{"h1@h1:0", "", `launcher: include "h1@h1:0": host "h1" named twice`},
		{"h1:", "", `launcher: include "h1:": "h1:": no GPU ids after ':'`},
		{"h1@", "", `launcher: include "h1@": "": empty host name`},
		{":0", "", `launcher: include ":0": ":0": empty host name`},
		{"[::1", "", `launcher: include "[::1": "[::1": missing ']'`},
		{"::1:0", "", `launcher: include "::1:0": "::1:0": an IPv6 address must be in brackets, as [::1]:0,1`},
		{"[::1]0", "", `launcher: include "[::1]0": "[::1]0": unexpected "0" after ']'`},
		{"", "h1@h2@[::1]@h4", `launcher: exclude "h1@h2@[::1]@h4": leaves no hosts`},
	}
	for _, tt := range bad {
		got, err := SelectHosts(hosts, tt.include, tt.exclude)
		if err == nil || got != nil {
			t.Errorf("SelectHosts(%q, %q) = %+v, %v; want nothing and an error", tt.include, tt.exclude, got, err)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("SelectHosts(%q, %q) error\n %s\nwant\n %s", tt.include, tt.exclude, err, tt.want)
		}
	}
}
