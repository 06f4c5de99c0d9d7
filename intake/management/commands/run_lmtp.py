"""`manage.py run_lmtp`: Mailroom as the mail server's delivery target (LMTP, or SMTP with --smtp).

Thin: options (each with an environment default, so `make run` and a service unit need no flags)
become an `intake.channels.lmtp_server.ListenerConfig`, and the listener runs until SIGTERM or Ctrl-C.
"""

import asyncio
import os
import signal
import socket

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from intake.channels.lmtp_server import DataLimits, ListenerConfig, serve


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Command(BaseCommand):
    help = (
        "Accept mail by LMTP (or SMTP with --smtp) and answer 250 only once each message is stored; "
        "451 when it could not be, so the mail server keeps it and retries."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("MAILROOM_LMTP_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=_env_int("MAILROOM_LMTP_PORT", 8024))
        parser.add_argument(
            "--socket",
            default=os.environ.get("MAILROOM_LMTP_SOCKET", ""),
            help="listen on this unix socket instead of --host/--port (who may deliver is then who may open the file)",
        )
        parser.add_argument(
            "--socket-mode",
            default=os.environ.get("MAILROOM_LMTP_SOCKET_MODE", "660"),
            help="the socket file's permissions, octal (default 660: owner and group)",
        )
        parser.add_argument(
            "--smtp",
            action="store_true",
            default=_env_bool("MAILROOM_LMTP_SMTP"),
            help="speak SMTP instead of LMTP (one answer per message, not per recipient)",
        )
        parser.add_argument(
            "--tls-cert",
            default=os.environ.get("MAILROOM_LMTP_TLS_CERT", ""),
            help="PEM certificate (chain) offered by STARTTLS",
        )
        parser.add_argument(
            "--tls-key", default=os.environ.get("MAILROOM_LMTP_TLS_KEY", ""), help="PEM private key of --tls-cert"
        )
        parser.add_argument(
            "--require-starttls",
            action="store_true",
            default=_env_bool("MAILROOM_LMTP_REQUIRE_STARTTLS"),
            help="refuse MAIL before STARTTLS (needs --tls-cert)",
        )
        parser.add_argument(
            "--max-connections-per-client",
            type=int,
            default=_env_int("MAILROOM_LMTP_MAX_CONNECTIONS_PER_CLIENT", 20),
            help="open sessions per client address (0: no limit); over it: 421 4.7.0",
        )
        parser.add_argument(
            "--max-messages-per-minute",
            type=int,
            default=_env_int("MAILROOM_LMTP_MAX_MESSAGES_PER_MINUTE", 600),
            help="messages per client address per minute (0: no limit); over it: 451 4.7.1",
        )
        parser.add_argument(
            "--idle-timeout",
            type=float,
            default=_env_float("MAILROOM_LMTP_IDLE_TIMEOUT_SECONDS", 30.0),
            help="seconds a session may wait between commands before it is closed",
        )
        parser.add_argument(
            "--data-timeout",
            type=float,
            default=_env_float("MAILROOM_LMTP_DATA_TIMEOUT_SECONDS", 180.0),
            help="seconds from DATA to the end of the message (and again to store it); over it: 421 4.4.2",
        )
        parser.add_argument(
            "--min-data-rate",
            type=int,
            default=_env_int("MAILROOM_LMTP_MIN_DATA_RATE", 10240),
            help="bytes/s a message must arrive at, over every --data-grace seconds "
            "(0: no minimum); under it: 421 4.4.2",
        )
        parser.add_argument(
            "--data-grace",
            type=float,
            default=_env_float("MAILROOM_LMTP_DATA_GRACE_SECONDS", 10.0),
            help="the window, in seconds, over which --min-data-rate is measured",
        )
        parser.add_argument(
            "--hostname",
            default=os.environ.get("MAILROOM_LMTP_HOSTNAME", socket.gethostname()),
            help="the name in the greeting and in LHLO/EHLO",
        )
        parser.add_argument(
            "--database-threads",
            type=int,
            default=_env_int("MAILROOM_LMTP_DATABASE_THREADS", 4),
            help="threads (each with its own database connection) that store messages",
        )

    def handle(self, *args, **options):
        if bool(options["tls_cert"]) != bool(options["tls_key"]):
            raise CommandError("--tls-cert and --tls-key go together")
        if options["require_starttls"] and not options["tls_cert"]:
            raise CommandError("--require-starttls needs --tls-cert and --tls-key")
        for name in ("idle_timeout", "data_timeout", "data_grace"):
            if options[name] <= 0:
                raise CommandError(f"--{name.replace('_', '-')} must be a positive number of seconds")
        if options["min_data_rate"] < 0:
            raise CommandError("--min-data-rate must be 0 (no minimum) or a positive number of bytes/s")
        try:
            socket_mode = int(str(options["socket_mode"]), 8)
        except ValueError:
            raise CommandError(
                f"--socket-mode must be octal permissions such as 660, not {options['socket_mode']!r}"
            ) from None
        config = ListenerConfig(
            host=options["host"],
            port=options["port"],
            smtp=options["smtp"],
            max_message_bytes=settings.MAILROOM_MAX_MESSAGE_BYTES,
            tls_cert=options["tls_cert"],
            tls_key=options["tls_key"],
            require_starttls=options["require_starttls"],
            max_connections_per_client=options["max_connections_per_client"],
            max_messages_per_minute=options["max_messages_per_minute"],
            hostname=options["hostname"],
            database_threads=max(1, options["database_threads"]),
            socket_path=options["socket"],
            socket_mode=socket_mode,
            idle_timeout_seconds=options["idle_timeout"],
            data_limits=DataLimits(
                timeout_seconds=options["data_timeout"],
                min_rate=options["min_data_rate"],
                grace_seconds=options["data_grace"],
            ),
        )
        asyncio.run(self._run(config))

    async def _run(self, config: ListenerConfig) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def ready(where: str):
            self.stdout.write(f"{config.source} listening on {where}")
            self.stdout.flush()

        try:
            await serve(config, stop, ready=ready)
        except (ValueError, OSError) as exc:  # the socket path is taken, the port in use
            raise CommandError(f"cannot listen: {exc}") from None
