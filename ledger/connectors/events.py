"""What reading a provider's inbound event (a webhook) may end in, besides the event."""


class WebhookRefused(ValueError):
    """An event whose signature does not hold, or that its connector does not know."""
