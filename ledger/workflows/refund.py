"""The refund workflow: look the order up, refund it, record it, tell the customer."""

from rest_framework import serializers

from ledger.recipients import TARGET_LENGTH, RecipientRefused, customer_spelling, email_recipient, email_recipient_checked
from ledger.validation import AmountField, CurrencyField, CustomerField, PayableAmount, StrictSerializer
from ledger.connectors import connector_for, http
from ledger.actions import action_by_key
from ledger.models import ActionType, Confirmation

from . import ActionSpec, StepFailed, Workflow, effect, local, read


# Where the confirmation goes without `notify`: the customer at this domain.
CUSTOMERS_AT = "@customers.surety.example"


class RefundInput(PayableAmount, StrictSerializer):
    """Checked as a refund's params are: an amount the refund's connector can pay, in canonical form.
    Every field fits the actions the steps record from it, so that no step fails on it after the
    refund was made (without `notify`, a customer is also the recipient's name, before CUSTOMERS_AT)."""

    order_id = serializers.CharField(max_length=TARGET_LENGTH)
    amount = AmountField()
    currency = CurrencyField()
    customer = CustomerField(max_length=255)  # its column
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True)
    notify = serializers.EmailField(required=False, max_length=TARGET_LENGTH, help_text="where to send the confirmation")
    decision_id = serializers.CharField(
        max_length=255, required=False, allow_blank=True,
        help_text="the agent's decision this refund carries out: one refund per order and decision, whether asked "
                  "by a task or directly (without it the task's id is its decision)")

    def validate(self, data):
        notify = data.get("notify")
        try:
            # The recipient notify_customer records, held to the API's rule for one.
            recipient = email_recipient_checked(notify or default_recipient(data["customer"]))
        except RecipientRefused as refused:
            self._refuse_recipient(refused, notify)
        else:
            if notify:  # recorded so (as the mail is sent to it): a retry spelled otherwise is the same task
                data["notify"] = recipient
        return super().validate(data)

    def _refuse_recipient(self, refused, notify):
        if notify:  # an e-mail address to its field's own check: held, it does not fit, or it cannot be sent to
            raise serializers.ValidationError({"notify": [
                f"At most {TARGET_LENGTH} characters as it is sent to (its domain in ASCII)." if refused.is_address
                else "Not an e-mail address the mail can be sent to."]})
        if not refused.fits:  # in lower case: "İ" is one character and its lower case two
            raise serializers.ValidationError({"customer": [
                f"At most {TARGET_LENGTH - len(CUSTOMERS_AT)} characters without notify: the confirmation goes to "
                f"<customer>{CUSTOMERS_AT}."]})
        # Only a new task: one recorded before this rule is replayed under its id as it was
        # (context["recorded"]: asked only now, a statement the other requests do not pay).
        if not self.context.get("recorded", bool)():
            raise serializers.ValidationError({"customer": [
                f"Without notify the confirmation goes to <customer>{CUSTOMERS_AT}, and {refused.address!r} is not "
                "an e-mail address: give notify."]})


def lookup_order(ctx):
    """The order as the refund's provider keeps it, read by the refund's connector (the sandbox's
    order, Stripe's charge or payment intent); a connector that keeps no orders reads none."""
    order_id = ctx.input["order_id"]
    try:
        with http.deadline():
            order = connector_for(ActionType.REFUND).find_order(order_id)
    except http.Rejected as exc:
        if exc.status == 404:
            raise StepFailed(f"order {order_id} is unknown", retryable=False, code="unknown_order") from exc
        raise StepFailed(str(exc), retryable=False, code=exc.code) from exc
    except http.ProviderError as exc:
        raise StepFailed(str(exc), retryable=True, code=exc.code, retry_after=getattr(exc, "retry_after", None)) from exc
    return order or {"order_id": order_id, "customer": "", "amount": None, "not_read": "the refund's connector keeps no orders"}


def call_refund_api(ctx):
    """The refund, for the customer in the ledger's spelling: a task recorded before customers were
    kept so holds its customer as written then, and its refund so recorded would escape the
    customer's daily total and hold. Its action recorded then under the step's key is still its
    replay (ledger.actions._replay compares customers in the ledger's spelling)."""
    params = {"amount": ctx.input["amount"], "currency": ctx.input["currency"]}
    if ctx.input.get("reason"):
        params["reason"] = ctx.input["reason"]
    return ActionSpec(ActionType.REFUND, ctx.input["order_id"], params,
                      customer=customer_spelling(ctx.input["customer"]), decision_id=ctx.input.get("decision_id", ""))


def refunded(ctx):
    """The amount the refund step refunded: a person may have edited it down (ledger.versions), and
    the task went on with their version, whose key the step's checkpoint names."""
    version = ctx.results["call_refund_api"].get("operation_key")
    return action_by_key(version).params["amount"] if version else ctx.input["amount"]


def write_confirmation(ctx, key):
    refund = ctx.results["call_refund_api"]
    confirmation, _ = Confirmation.objects.get_or_create(
        key=key,
        defaults={"task": ctx.task, "order_id": ctx.input["order_id"], "external_ref": refund["external_ref"],
                  "amount": refunded(ctx), "currency": ctx.input["currency"]},
    )
    return {"confirmation": confirmation.key, "external_ref": confirmation.external_ref}


def default_recipient(customer):
    """Where the confirmation goes without `notify`."""
    return f"{customer.lower()}{CUSTOMERS_AT}"


def notify_customer(ctx):
    # As the API records a recipient (its domain in one spelling): the agent's own message to it
    # for the decision is then this one, not a second.
    recipient = email_recipient(ctx.input.get("notify") or default_recipient(ctx.input["customer"]))
    body = (f"We refunded {refunded(ctx)} {ctx.input['currency']} for order {ctx.input['order_id']} "
            f"(reference {ctx.results['call_refund_api']['external_ref']}).")
    return ActionSpec(ActionType.SEND_MESSAGE, recipient,
                      {"channel": "email", "message_type": "refund_confirmation", "body": body})


REFUND = Workflow(
    "refund",
    RefundInput,
    [
        read("lookup_order", lookup_order),
        effect("call_refund_api", call_refund_api),
        local("write_confirmation", write_confirmation),
        effect("notify_customer", notify_customer),
    ],
)
