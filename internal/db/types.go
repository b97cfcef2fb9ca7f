package db

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// registerTypes teaches a connection's type map to send google/uuid values
// as binary UUIDs. Without it pgx encodes a uuid.UUID through its
// driver.Valuer: String() into 36 characters, which the type map then parses
// back into 16 bytes, for every id of every statement — the relay's mark
// sends a batch's ids as one array, and a payment sends a dozen ids. In a
// CPU profile of bench P1 this was 6 % of the process (pgtype's
// encodePlanDriverValuer). The wrapper runs before the Valuer fallback, and
// only for uuid.UUID; every other type is encoded as before.
func registerTypes(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapUUID}, m.TryWrapEncodePlanFuncs...)
}

// binaryUUID is a uuid.UUID as pgtype's UUID codec reads it directly.
type binaryUUID uuid.UUID

func (u binaryUUID) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: u, Valid: true}, nil }

func tryWrapUUID(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if u, ok := value.(uuid.UUID); ok {
		return &wrapUUIDPlan{}, binaryUUID(u), true
	}
	return nil, nil, false
}

type wrapUUIDPlan struct{ next pgtype.EncodePlan }

func (p *wrapUUIDPlan) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *wrapUUIDPlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.next.Encode(binaryUUID(value.(uuid.UUID)), buf)
}
