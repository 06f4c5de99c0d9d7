"""The ways mail comes in, one module per channel: provider webhooks (`webhooks`), cursor-based polling
(`polling`, its beat schedules in `schedules`, push subscriptions in `graph_subscriptions`), the mail server's
LMTP/SMTP delivery target (`lmtp`: what a delivery does; `lmtp_server`: the protocol) and an MTA's pipe
(`mailgate`, a console script that imports no Django). Each stores through `intake.services` and nothing
else; the providers they talk to are `intake.providers`.
"""
