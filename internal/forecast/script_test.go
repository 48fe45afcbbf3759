package forecast

import (
	"fmt"
	"strings"
	"testing"
)

// The script spells sparseScores as a literal (a script's source must be a
// constant); this keeps the two equal.
func TestCountScriptSpellsSparseScores(t *testing.T) {
	if want := fmt.Sprintf("total <= %d ", sparseScores); !strings.Contains(countSrc, want) {
		t.Fatalf("countScript does not contain %q: update the literal with sparseScores", want)
	}
}
