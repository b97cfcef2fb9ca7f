package broker_test

import (
	"testing"

	"github.com/sluice-dev/sluice/internal/broker"
)

// The shard of an aggregate is pinned: relays of different versions and
// hosts must agree, or an aggregate's events would travel on two shards and
// lose their order. These values are FNV-1a of "type\x00id" mod n.
func TestShardOfIsStableAndInRange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		typ, id string
		n, want int
	}{
		{"x", "y", 0, 0},
		{"x", "y", 1, 0},
	} {
		if got := broker.ShardOf(tc.typ, tc.id, tc.n); got != tc.want {
			t.Errorf("ShardOf(%q, %q, %d) = %d, want %d", tc.typ, tc.id, tc.n, got, tc.want)
		}
	}
	// Pinned values (computed once; a change here strands events).
	pinned := map[[2]string]int{{"invoice", "inv-1"}: pin("invoice", "inv-1"), {"payment", "op-42"}: pin("payment", "op-42")}
	for k, want := range pinned {
		if got := broker.ShardOf(k[0], k[1], 16); got != want {
			t.Errorf("ShardOf(%q, %q, 16) = %d, want %d", k[0], k[1], got, want)
		}
	}
	// Type and id are separated: ("ab","c") and ("a","bc") are different
	// aggregates and must not be forced together by concatenation.
	seen := map[int]int{}
	for i := range 1600 {
		s := broker.ShardOf("order", string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('0'+i/676)), 16)
		if s < 0 || s >= 16 {
			t.Fatalf("shard %d out of range", s)
		}
		seen[s]++
	}
	for s := range 16 {
		if seen[s] < 50 {
			t.Errorf("shard %d got %d of 1600 aggregates: the hash does not spread", s, seen[s])
		}
	}
}

// pin is FNV-1a 32 written independently of ShardOf.
func pin(typ, id string) int {
	h := uint32(0x811c9dc5)
	for _, b := range []byte(typ + "\x00" + id) {
		h ^= uint32(b)
		h *= 0x01000193
	}
	return int(h % 16)
}
