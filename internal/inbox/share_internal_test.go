package inbox

import (
	"fmt"
	"testing"
)

// What a process gives up for its peers: never below the fair share, only
// shards a peer below its share may read, no more than that peer lacks.
func TestToReleaseGivesUpOnlyWhatAPeerBelowItsShareCanTake(t *testing.T) {
	t.Parallel()
	all := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	cases := []struct {
		name  string
		mine  []int
		fair  int
		peers []peer
		want  []int
	}{
		{"alone", all(16), 16, nil, nil},
		{"a newcomer gets half", all(16), 8, []peer{{held: []int{}}}, []int{15, 14, 13, 12, 11, 10, 9, 8}},
		{"at the share already", all(8), 8, []peer{{held: all(8)}}, nil},
		{"a peer at its share takes nothing", all(10), 6, []peer{{held: all(6)}}, nil},
		{"only what the peer may read", all(16), 8, []peer{{owned: []int{0, 1, 2, 3}, held: []int{}}}, []int{3, 2, 1, 0}},
		{"no more than each peer lacks", all(16), 6, []peer{{held: []int{0, 1, 2, 3, 4}}, {held: []int{}}}, []int{15, 14, 13, 12, 11, 10, 9}},
		{"no more than above the share", all(7), 6, []peer{{held: []int{}}, {held: []int{}}}, []int{6}},
		{"a peer that may read none of ours", []int{8, 9, 10}, 2, []peer{{owned: []int{0, 1}, held: []int{}}}, nil},
		// At its share, a process gives a restricted peer the one shard it
		// lacks when another peer is over the share (that one gives this
		// process a shard back next): a full CI run stopped at 6, 9, 1.
		{"at the share, for a restricted peer while another is over", []int{0, 2, 3, 4, 5, 6}, 6,
			[]peer{{held: []int{7, 8, 9, 10, 11, 12, 13, 14, 15}}, {owned: []int{0, 1}, held: []int{1}}}, []int{0}},
		{"at the share, nobody over: kept", []int{0, 2, 3, 4, 5, 6}, 6,
			[]peer{{held: []int{7, 8, 9, 10, 11, 12}}, {owned: []int{0, 1}, held: []int{1}}}, nil},
		{"below the share: kept", []int{0, 2, 3}, 6,
			[]peer{{held: []int{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}, {owned: []int{0, 1}, held: []int{1}}}, nil},
		{"a restricted peer lacking its only shard", []int{0, 2, 3, 4, 5, 6}, 6,
			[]peer{{held: []int{7, 8, 9, 10, 11, 12, 13, 14, 15}}, {owned: []int{0}, held: []int{}}}, []int{0}},
		{"a restricted peer with all it may read", []int{2, 3, 4, 5, 6, 7}, 6,
			[]peer{{held: []int{8, 9, 10, 11, 12, 13, 14, 15, 16}}, {owned: []int{0, 1}, held: []int{0, 1}}}, nil},
	}
	for _, c := range cases {
		if got := toRelease(c.mine, c.fair, c.peers); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: toRelease = %v, want %v", c.name, got, c.want)
		}
	}
	for _, c := range []struct{ shards, n, want int }{{16, 1, 16}, {16, 2, 8}, {16, 3, 6}, {3, 4, 1}} {
		if got := fairShare(c.shards, c.n); got != c.want {
			t.Errorf("fairShare(%d, %d) = %d, want %d", c.shards, c.n, got, c.want)
		}
	}
}
