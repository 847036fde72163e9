package rendezvous

import "testing"

func TestPlanBatch(t *testing.T) {
	lim := limits{maxKeyLen: 16, maxValueLen: 32, maxKeys: 4}
	whole113 := cat(add113("/init/", 1), wait113("/a", "/b"), get113("/a"), numKeys113())
	wholeV2 := cat(setV2("/k", "v"), multiSetV2("/a", "1", "/b", "2"), multiGetV2("/a", "/b"), pingV2(7), cancelWaitV2(), listV2())
	for _, tc := range []struct {
		name   string
		b      []byte
		filled bool
		d      Dialect
		want   batchPlan
	}{
		{"nothing more after a greeting", nil, false, DialectV2, planInline},
		{"one 1.13 add", add113("/init/", 1), false, Dialect113, planInline},
		{"a lone 1.13 num_keys byte", numKeys113(), false, Dialect113, planInline},
		{"pipelined 1.13 requests", whole113, false, Dialect113, planInline},
		{"pipelined v2 requests", wholeV2, false, DialectV2, planInline},
		{"a 1.13 watch", watch113("/k"), false, Dialect113, planInline},
		{"a read that filled the buffer", whole113, true, Dialect113, planHandOff},
		{"the type byte alone", u8(3), false, Dialect113, planHandOff},
		{"a key cut short", add113("/init/", 1)[:5], false, Dialect113, planHandOff},
		{"an add without its delta", add113("/init/", 1)[:1+8+6+4], false, Dialect113, planHandOff},
		{"whole requests then a partial one", cat(whole113, get113("/a")[:3]), false, Dialect113, planHandOff},
		{"a key list cut inside", wait113("/a", "/b")[:1+8+8+2], false, Dialect113, planHandOff},
		{"a multi_set without its last value", multiSetV2("/a", "1", "/b", "2")[:1+8+8+2+8+1+8+2], false, DialectV2, planHandOff},
		{"an unknown 1.13 type", u8(9), false, Dialect113, planHandOff},
		{"an unknown v2 type", u8(18), false, DialectV2, planHandOff},
		{"a v2-only query on a 1.13 connection", pingV2(7), false, Dialect113, planHandOff},
		{"a key over the limit", get113("/a-key-longer-than-16"), false, Dialect113, planHandOff},
		{"a value over the limit", setV2("/k", string(make([]byte, 33))), false, DialectV2, planHandOff},
		{"too many keys", waitV2("/a", "/b", "/c", "/d", "/e"), false, DialectV2, planHandOff},
		{"a length of 2^64-1", cat(u8(3), u64(^uint64(0))), false, DialectV2, planHandOff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := planBatch(tc.b, tc.filled, tc.d, lim); got != tc.want {
				t.Fatalf("planBatch(% x) = %v, want %v", tc.b, got, tc.want)
			}
		})
	}
}

func TestDetectDialectBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		d    Dialect
		skip int
		ok   bool
	}{
		{"nothing yet", nil, Dialect113, 0, false},
		{"a 1.13 add", add113("/k", 1), Dialect113, 0, true},
		{"a lone 1.13 num_keys", numKeys113(), Dialect113, 0, true},
		{"a zero alone: a v2 greeting or a 1.13 set", u8(0), Dialect113, 0, false},
		{"a greeting cut short", v2Hello[:4], Dialect113, 0, false},
		{"a v2 greeting", v2Hello, DialectV2, 5, true},
		{"a v2 greeting and a request", cat(v2Hello, pingV2(1)), DialectV2, 5, true},
		{"a 1.13 set", set113("/k", "v"), Dialect113, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, skip, ok := detectDialectBytes(tc.b)
			if ok != tc.ok || (ok && (d != tc.d || skip != tc.skip)) {
				t.Fatalf("detectDialectBytes(% x) = %v, %d, %v; want %v, %d, %v", tc.b, d, skip, ok, tc.d, tc.skip, tc.ok)
			}
		})
	}
}

func (p batchPlan) String() string {
	if p == planInline {
		return "inline"
	}
	return "hand off"
}
