package outbox

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// The relay's mark and release send a batch's ids in binary whatever pool it
// was given: on pgx's default type map (a pool not opened by db.OpenConfig) a
// []uuid.UUID goes through each id's driver.Valuer (a string and a failed
// encode per id: 20 allocations), idsOf's values through the UUID codec
// directly. Counted in allocations, which do not depend on the machine's
// speed.
func TestIDsAreEncodedInBinaryOnAnyPool(t *testing.T) {
	evs := make([]claimed, 500)
	plain := make([]uuid.UUID, len(evs))
	for i := range evs {
		evs[i].ID = uuid.New()
		plain[i] = evs[i].ID
	}
	m := pgtype.NewMap()
	allocs := func(v any) float64 {
		buf := make([]byte, 0, 64<<10)
		return testing.AllocsPerRun(20, func() {
			if _, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, v, buf[:0]); err != nil {
				t.Fatal(err)
			}
		})
	}
	viaValuer, direct := allocs(plain), allocs(idsOf(evs))
	if viaValuer < float64(len(evs)) {
		t.Fatalf("[]uuid.UUID took %.0f allocations for %d ids: the default map no longer goes through the Valuer, and this test proves nothing", viaValuer, len(evs))
	}
	// At most the one an array element costs when pgx boxes it as an any.
	if direct > float64(len(evs)+10) {
		t.Fatalf("idsOf's %d ids took %.0f allocations to encode (the Valuer path took %.0f): not the binary codec", len(evs), direct, viaValuer)
	}
	var back []uuid.UUID
	buf, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, idsOf(evs), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Scan(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, buf, &back); err != nil || len(back) != len(evs) || back[0] != evs[0].ID || back[499] != evs[499].ID {
		t.Fatalf("decoded %d ids (%v), want the %d sent", len(back), err, len(evs))
	}
}
