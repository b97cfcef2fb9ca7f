package main

import "testing"

// The table must never print a ratio that reads as its goal beside a ✗ (or
// below it beside a ✓): it takes more decimals only then.
func TestRatioTextTellsTheRatioFromItsGoal(t *testing.T) {
	for _, c := range []struct {
		v, goal float64
		want    string
	}{
		{1.1999051075936686, 1.2, "1.1999×"}, // the quick run of 6 December: "1.20× 1.2× ✗"
		{1.2, 1.2, "1.20×"},
		{1.2004, 1.2, "1.20×"},
		{1.19, 1.2, "1.19×"},
		{1.4386929418004082, 1.2, "1.44×"},
		{1.4999999, 1.5, "1.4999999×"}, // six decimals still round up to the goal: every digit
		{0.6643885721167545, 0.5, "0.66×"},
		{4.896152234251915, 0, "4.90×"}, // no goal
	} {
		if got := ratioText(c.v, c.goal); got != c.want {
			t.Errorf("ratioText(%v, %v) = %q, want %q", c.v, c.goal, got, c.want)
		}
	}
}
