"""An action's evidence record as this product composes it: the ledger's record
(ledger.evidence) with the sections of the apps built on it, in this order. The API's evidence
read, its OpenAPI document, the printable page and the JSON file all take them from here.

The dashboard's record is staff's, whole (`for_staff`): the people who may read the audit log see
the limit's tiers there as on the policies page and in the audit log, and every event's content hash
can be recomputed from the file. The API's is the agent's, without staff's addresses (decision 62)."""

from approvals.evidence import STAFF_ADDRESSES, ApprovalsEvidenceSerializer, approvals_evidence
from dlq.evidence import DeadLettersEvidenceSerializer, deadletters_evidence
from ledger.evidence import EvidenceSection, evidence_record

SECTIONS = (
    # Review items with who decided, and the limit in force when the action was requested.
    # The limit's tiers name staff: withheld from the agent's record.
    EvidenceSection("approvals", approvals_evidence, ApprovalsEvidenceSerializer, "ledger/evidence_approvals.html",
                    withheld=STAFF_ADDRESSES),
    # Dead-letter entries, their alerts and deliveries, and reconciliation incidents.
    EvidenceSection("dead_letters", deadletters_evidence, DeadLettersEvidenceSerializer,
                    "ledger/evidence_dead_letters.html"),
)


def evidence_export(action):
    """Staff's record of `action` (one of `ledger.evidence.evidence_actions()`), JSON-ready and signed."""
    return evidence_record(action, SECTIONS, for_staff=True)
