"""The library corpus, part two: state stores, mail, brokers, exception groups and Dagster's own errors.

redis-py against a RESP peer that answers with scripted error replies and against the local Redis;
PyMySQL against the local MariaDB and a MySQL wire-protocol peer (for the errors a healthy server
will not produce on demand: too many connections, shutdown, read-only); asyncpg against the local
PostgreSQL; smtplib against an SMTP peer with scripted reply codes; kombu against the local RabbitMQ.
"""

from __future__ import annotations

import asyncio
import smtplib
import socket
import threading
import time
import uuid
from contextlib import ExitStack, suppress

from classify_corpus import _free_port, raised
from classify_corpus_libraries import PERMANENT, TRANSIENT, LibCase, case
from classify_corpus_servers import mysql_server, serve_lines

# -- redis-py -------------------------------------------------------------------------------------

REDIS_REPLIES = [
    ("LOADING Redis is loading the dataset in memory", TRANSIENT), ("BUSY Redis is busy running a script.", TRANSIENT),
    ("TRYAGAIN Multiple keys request during rehashing of slot", TRANSIENT),
    ("CLUSTERDOWN The cluster is down", TRANSIENT), ("MASTERDOWN Link with MASTER is down", TRANSIENT),
    ("READONLY You can't write against a read only replica.", TRANSIENT),
    ("OOM command not allowed when used memory > 'maxmemory'.", TRANSIENT),
    ("ERR max number of clients reached", TRANSIENT),
    ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.", TRANSIENT),
    ("NOREPLICAS Not enough good replicas to write.", TRANSIENT),
    ("NOAUTH Authentication required.", PERMANENT), ("WRONGPASS invalid username-password pair", PERMANENT),
    ("NOPERM this user has no permissions to run the 'get' command", PERMANENT),
    ("WRONGTYPE Operation against a key holding the wrong kind of value", PERMANENT),
    ("ERR unknown command 'FROB', with args beginning with:", PERMANENT),
    ("EXECABORT Transaction discarded because of previous errors.", PERMANENT),
    ("NOSCRIPT No matching script. Please use EVAL.", PERMANENT), ("ERR syntax error", PERMANENT),
]


def redis_cases() -> list[LibCase]:
    import redis

    state = {"reply": b"+OK\r\n"}
    command: dict[str, list[bytes] | int] = {"args": [], "want": 0}

    def answer(line: bytes) -> bytes | None:
        """Collect one RESP command (``*N``, then N bulk strings), then answer it from the script."""
        if line.startswith(b"*"):
            command["args"], command["want"] = [], int(line[1:])
            return b""
        if line.startswith(b"$"):
            return b""
        command["args"].append(line)
        if len(command["args"]) < command["want"]:
            return b""
        name = command["args"][0].upper()
        if name in (b"CLIENT", b"SELECT"):
            return b"+OK\r\n"
        if name == b"HELLO":
            return b"-ERR unknown command 'HELLO'\r\n"
        if state["reply"] == b"hangup":
            return None
        return b"" if state["reply"] == b"silent" else state["reply"]

    cases: list[LibCase] = []
    with ExitStack() as stack:
        listener, port = serve_lines(lambda: b"", answer)
        stack.callback(listener.close)

        def get() -> object:
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5, socket_connect_timeout=1,
                                 retry=None, protocol=2)
            try:
                return client.get("k")
            finally:
                client.close()

        for reply, label in REDIS_REPLIES:
            state["reply"] = f"-{reply}\r\n".encode()
            cases.append(case(f"redis-{reply.split()[0].lower()}-{reply.split()[1].lower()}", label, get,
                              f"redis-py GET; the RESP peer answers -{reply}"))
        state["reply"] = b"hangup"
        cases.append(case("redis-hangup", TRANSIENT, get, "redis-py GET; the peer closes the connection instead"))
        state["reply"] = b"silent"
        cases.append(
            case("redis-timeout", TRANSIENT, get, "redis-py GET, socket_timeout 0.5 s; the peer never answers")
        )
        state["reply"] = b"?what\r\n"
        cases.append(case("redis-protocol-garbage", PERMANENT, get,
                          "redis-py GET; the peer answers a line that is not RESP: InvalidResponse"))
    dead = redis.Redis(host="127.0.0.1", port=_free_port(), socket_connect_timeout=1, retry=None)
    cases.append(case("redis-refused", TRANSIENT, lambda: dead.ping(), "redis-py PING to a closed port"))
    cases += _real_redis_cases(redis)
    return cases


def _real_redis_cases(redis) -> list[LibCase]:
    client = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=5)
    key = f"rx-corpus-{uuid.uuid4().hex}"
    try:
        client.rpush(key, "a")
        cases = [case("redis-real-wrongtype", PERMANENT, lambda: client.get(key), "GET of a list on the local Redis"),
                 case("redis-real-unknown-command", PERMANENT, lambda: client.execute_command("FROBNICATE"),
                      "an unknown command sent to the local Redis")]

        def watched() -> None:
            with client.pipeline() as pipe:
                pipe.watch(key)
                client.rpush(key, "b")  # another writer changes the watched key
                pipe.multi()
                pipe.rpush(key, "c")
                pipe.execute()

        cases.append(case("redis-real-watch-conflict", TRANSIENT, watched,
                          "a WATCH/MULTI/EXEC transaction whose key another client changed: WatchError"))
        lock = client.lock(f"{key}-lock", timeout=5)
        cases.append(case("redis-real-lock-not-owned", PERMANENT, lambda: lock.release(),
                          "redis-py Lock.release of a lock never acquired: LockError"))
        pool = redis.BlockingConnectionPool(host="127.0.0.1", port=6379, max_connections=1, timeout=0.2)
        held = pool.get_connection()
        try:
            cases.append(case("redis-real-pool-exhausted", TRANSIENT, lambda: redis.Redis(connection_pool=pool).ping(),
                              "BlockingConnectionPool(max_connections=1, timeout=0.2) with its one connection held"))
        finally:
            pool.release(held)
            pool.disconnect()
        return cases
    finally:
        client.delete(key, f"{key}-lock")
        client.close()


# -- MySQL / MariaDB -----------------------------------------------------------------------------

FAKE_MYSQL = [(1040, TRANSIENT, "greeting"), (1203, TRANSIENT, "login"), (1045, PERMANENT, "login"),
              (1044, PERMANENT, "login"), (1053, TRANSIENT, "query"), (1290, TRANSIENT, "query"),
              (3024, TRANSIENT, "query"), (4031, TRANSIENT, "query"), (1927, TRANSIENT, "query"),
              (1142, PERMANENT, "query"), (1637, TRANSIENT, "query")]


def mysql_cases() -> list[LibCase]:
    import pymysql
    from classify_corpus_servers import MYSQL_ERRORS

    cases: list[LibCase] = []
    with ExitStack() as stack:
        def peer(**kwargs) -> int:
            listener, port = mysql_server(**kwargs)
            stack.callback(listener.close)
            return port

        def query(port: int, sql: str, read_timeout: float | None = None):
            def run() -> None:
                conn = pymysql.connect(host="127.0.0.1", port=port, user="app", password="pw", connect_timeout=2,
                                       read_timeout=read_timeout)
                try:
                    conn.cursor().execute(sql)
                finally:
                    conn.close()
            return run

        plain = peer()
        for errno_, label, where in FAKE_MYSQL:
            error = (errno_, *MYSQL_ERRORS[errno_])
            port = peer(at_greeting=error) if where == "greeting" else peer(after_login=error) if where == "login" \
                else plain
            cases.append(case(f"mysql-wire-{errno_}", label, query(port, f"SELECT {errno_}"),
                              f"PyMySQL against a MySQL wire peer that answers error {errno_} at the {where}"))
        cases.append(case("mysql-wire-lost-mid-query", TRANSIENT, query(plain, "SELECT 0"),
                          "PyMySQL; the peer hangs up mid-query: 2013 Lost connection"))
        cases.append(case("mysql-wire-read-timeout", TRANSIENT, query(plain, "SELECT -1", read_timeout=0.3),
                          "PyMySQL read_timeout 0.3 s; the peer never answers the query: 2013"))
    cases.append(case("mysql-refused", TRANSIENT, lambda: pymysql.connect(host="127.0.0.1", port=_free_port(),
                                                                          connect_timeout=1),
                      "PyMySQL to a closed port: 2003 Can't connect"))
    return cases + _mariadb_cases(pymysql)


def _mariadb_cases(pymysql) -> list[LibCase]:
    db = f"rx_corpus_{uuid.uuid4().hex[:10]}"
    def connect(**kw):
        return pymysql.connect(host="127.0.0.1", port=3306, user="root", password="",
                                               connect_timeout=5, **({"autocommit": True} | kw))
    admin = connect()
    admin.cursor().execute(f"CREATE DATABASE {db}")
    try:
        setup = connect(database=db).cursor()
        setup.execute("CREATE TABLE parent (id INT PRIMARY KEY, name VARCHAR(4) NOT NULL) ENGINE=InnoDB")
        setup.execute("CREATE TABLE child (id INT PRIMARY KEY, parent INT, FOREIGN KEY (parent) REFERENCES parent(id))"
                      " ENGINE=InnoDB")
        setup.execute("INSERT INTO parent VALUES (1, 'a'), (2, 'b')")
        setup.execute("SET SESSION sql_mode = 'STRICT_ALL_TABLES'")
        def sql(statement):
            return (lambda: setup.execute(statement))
        cases = [
            case("mariadb-1064-syntax", PERMANENT, sql("SELEC 1"), "PyMySQL against the local MariaDB: a syntax error"),
            case("mariadb-1146-no-table", PERMANENT, sql("SELECT * FROM nowhere"), "MariaDB: an unknown table"),
            case("mariadb-1054-no-column", PERMANENT, sql("SELECT nope FROM parent"), "MariaDB: an unknown column"),
            case("mariadb-1062-duplicate", PERMANENT, sql("INSERT INTO parent VALUES (1, 'x')"),
                 "MariaDB: a duplicate primary key"),
            case("mariadb-1452-foreign-key", PERMANENT, sql("INSERT INTO child VALUES (1, 99)"),
                 "MariaDB: a foreign key to a missing row"),
            case("mariadb-1406-too-long", PERMANENT, sql("INSERT INTO parent VALUES (3, 'toolong')"),
                 "MariaDB strict mode: a value too long for its column"),
            case("mariadb-1048-null", PERMANENT, sql("INSERT INTO parent VALUES (4, NULL)"),
                 "MariaDB: NULL into a NOT NULL column"),
            case("mariadb-1049-unknown-db", PERMANENT, lambda: connect(database="rx_no_such_db"),
                 "PyMySQL connect to a database that does not exist"),
            case("mariadb-1045-access-denied", PERMANENT, lambda: pymysql.connect(
                host="127.0.0.1", port=3306, user="rx_nobody", password="wrong", connect_timeout=5),
                "PyMySQL connect as an unknown user with a password"),
            case("mariadb-1969-statement-time", TRANSIENT,
                 sql("SET STATEMENT max_statement_time=0.2 FOR SELECT SLEEP(2)"),
                 "MariaDB max_statement_time 0.2 s over SLEEP(2)"),
        ]
        cases.append(case("mariadb-1205-lock-wait", TRANSIENT, lambda: _mariadb_lock_wait(connect, db),
                          "MariaDB: a row held FOR UPDATE by another transaction, innodb_lock_wait_timeout=1"))
        cases.append(case("mariadb-1213-deadlock", TRANSIENT, lambda: _mariadb_deadlock(connect, db),
                          "MariaDB: two transactions lock two rows in opposite orders"))
        cases.append(case("mariadb-1317-killed-query", TRANSIENT, lambda: _mariadb_kill(connect, db, "QUERY"),
                          "MariaDB: KILL QUERY from another session while it waits for a row lock"))
        cases.append(case("mariadb-killed-connection", TRANSIENT, lambda: _mariadb_kill(connect, db, "CONNECTION"),
                          "MariaDB: KILL CONNECTION from another session while it waits for a row lock"))
        return cases
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {db}")
        admin.close()


def _mariadb_lock_wait(connect, db: str) -> None:
    holder, waiter = connect(database=db, autocommit=False), connect(database=db, autocommit=False)
    try:
        holder.cursor().execute("SELECT * FROM parent WHERE id = 1 FOR UPDATE")
        cursor = waiter.cursor()
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
        cursor.execute("UPDATE parent SET name = 'w' WHERE id = 1")
    finally:
        holder.rollback(), waiter.rollback(), holder.close(), waiter.close()


def _mariadb_deadlock(connect, db: str) -> None:
    first, second = connect(database=db, autocommit=False), connect(database=db, autocommit=False)
    failures: list[BaseException] = []
    try:
        first.cursor().execute("UPDATE parent SET name = 'f' WHERE id = 1")
        second.cursor().execute("UPDATE parent SET name = 's' WHERE id = 2")

        def cross(conn, row: int) -> None:
            try:
                conn.cursor().execute(f"UPDATE parent SET name = 'x' WHERE id = {row}")
            except Exception as exc:  # noqa: BLE001 - the deadlock victim's error is the case
                failures.append(exc)

        threads = [threading.Thread(target=cross, args=(first, 2)), threading.Thread(target=cross, args=(second, 1))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(15)
    finally:
        first.rollback(), second.rollback(), first.close(), second.close()
    if failures:
        raise failures[0]


def _mariadb_kill(connect, db: str, what: str) -> None:
    """KILL from another session while the victim waits for a row lock (a killed SLEEP just returns 1)."""
    holder, victim, killer = connect(database=db, autocommit=False), connect(database=db, autocommit=False), connect()
    holder.cursor().execute("SELECT * FROM parent WHERE id = 2 FOR UPDATE")
    thread_id = victim.thread_id()
    timer = threading.Timer(0.5, lambda: killer.cursor().execute(f"KILL {what} {thread_id}"))
    timer.start()
    try:
        victim.cursor().execute("UPDATE parent SET name = 'k' WHERE id = 2")
    finally:
        timer.join()
        holder.rollback(), holder.close(), killer.close()
        with suppress(Exception):  # a killed connection may already be gone
            victim.close()


# -- asyncpg -------------------------------------------------------------------------------------

def asyncpg_cases(pg_url: str) -> list[LibCase]:
    import asyncpg

    dsn = "postgresql://" + pg_url.split("://", 1)[1]

    def run(body):
        async def go():
            conn = await asyncpg.connect(dsn, timeout=5)
            try:
                return await body(conn)
            finally:
                await conn.close()
        return lambda: asyncio.run(go())

    async def setup(conn):
        await conn.execute("CREATE TABLE IF NOT EXISTS corpus (id int PRIMARY KEY, v int)")
        await conn.execute("INSERT INTO corpus VALUES (1, 0), (2, 0) ON CONFLICT DO NOTHING")

    run(setup)()

    async def lock_timeout(conn):
        other = await asyncpg.connect(dsn)
        try:
            async with other.transaction():
                await other.execute("SELECT * FROM corpus WHERE id = 1 FOR UPDATE")
                async with conn.transaction():
                    await conn.execute("SET LOCAL lock_timeout = '200ms'")
                    await conn.execute("UPDATE corpus SET v = 1 WHERE id = 1")
        finally:
            await other.close()

    async def deadlock(conn):
        other = await asyncpg.connect(dsn)
        try:
            a, b = conn.transaction(), other.transaction()
            await a.start(), await b.start()
            await conn.execute("UPDATE corpus SET v = v + 1 WHERE id = 1")
            await other.execute("UPDATE corpus SET v = v + 1 WHERE id = 2")
            results = await asyncio.gather(conn.execute("UPDATE corpus SET v = v + 1 WHERE id = 2"),
                                           other.execute("UPDATE corpus SET v = v + 1 WHERE id = 1"),
                                           return_exceptions=True)
            await a.rollback(), await b.rollback()
            raise next(r for r in results if isinstance(r, BaseException))
        finally:
            await other.close()

    async def terminated(conn):
        other = await asyncpg.connect(dsn)

        async def kill() -> None:
            await asyncio.sleep(0.3)
            await other.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())

        try:
            await asyncio.gather(conn.execute("SELECT pg_sleep(5)"), kill())
        finally:
            await other.close()

    async def closed(conn):
        await conn.close()
        await conn.execute("SELECT 1")

    async def concurrent(conn):
        await asyncio.gather(conn.execute("SELECT pg_sleep(0.2)"), conn.execute("SELECT 1"))

    role = f"rx_corpus_{uuid.uuid4().hex[:8]}"

    async def role_limit(conn):
        await conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
        try:
            await asyncpg.connect(dsn.replace("postgres@", f"{role}@", 1), timeout=5)
        finally:
            await conn.execute(f"DROP ROLE {role}")

    def sql(statement):
        return run(lambda conn: conn.execute(statement))
    return [
        case("asyncpg-syntax", PERMANENT, sql("SELEC 1"), "asyncpg against the local PostgreSQL: 42601"),
        case(
            "asyncpg-undefined-table",
            PERMANENT,
            sql("SELECT * FROM nowhere"),
            "asyncpg against the local PostgreSQL: an unknown table, 42P01",
        ),
        case(
            "asyncpg-unique",
            PERMANENT,
            sql("INSERT INTO corpus VALUES (1, 0)"),
            "asyncpg against the local PostgreSQL: a duplicate key, 23505",
        ),
        case(
            "asyncpg-division",
            PERMANENT,
            sql("SELECT 1 / 0"),
            "asyncpg against the local PostgreSQL: division by zero, 22012",
        ),
        case(
            "asyncpg-statement-timeout",
            TRANSIENT,
            sql("SET statement_timeout = '100ms'; SELECT pg_sleep(2)"),
            "asyncpg: statement_timeout 100 ms over pg_sleep(2): 57014",
        ),
        case(
            "asyncpg-lock-timeout",
            TRANSIENT,
            run(lock_timeout),
            "asyncpg: lock_timeout on a row held FOR UPDATE: 55P03",
        ),
        case(
            "asyncpg-deadlock", TRANSIENT, run(deadlock), "asyncpg: two connections lock rows in opposite orders: 40P01"
        ),
        case(
            "asyncpg-terminated",
            TRANSIENT,
            run(terminated),
            "asyncpg: pg_terminate_backend from another session during pg_sleep(5)",
        ),
        case("asyncpg-closed", TRANSIENT, run(closed), "asyncpg: a query on a connection already closed"),
        case(
            "asyncpg-concurrent-use",
            PERMANENT,
            run(concurrent),
            "asyncpg: two queries at once on one connection: InterfaceError (another operation in progress)",
        ),
        case(
            "asyncpg-role-limit",
            TRANSIENT,
            run(role_limit),
            "asyncpg connect as a role whose CONNECTION LIMIT is reached: 53300 too many connections",
        ),
        case(
            "asyncpg-no-database",
            PERMANENT,
            lambda: asyncio.run(asyncpg.connect(dsn.rsplit("/", 1)[0] + "/rx_no_such_db", timeout=5)),
            "asyncpg connect to a database that does not exist: 3D000",
        ),
        case(
            "asyncpg-refused",
            TRANSIENT,
            lambda: asyncio.run(asyncpg.connect(f"postgresql://postgres@127.0.0.1:{_free_port()}/x", timeout=5)),
            "asyncpg connect to a closed port",
        ),
    ]


# -- smtplib ---------------------------------------------------------------------------------------

def smtp_cases() -> list[LibCase]:
    script = {"greeting": b"220 corpus ESMTP\r\n"}

    def answer(line: bytes) -> bytes | None:
        verb = line.split(b" ", 1)[0].split(b":", 1)[0].upper()
        if script.get("data_mode"):
            if line == b".":
                script["data_mode"] = False
                return script.get("END", b"250 queued\r\n")
            return b""
        if verb == b"EHLO":
            return script.get("EHLO", b"250-corpus\r\n250-AUTH PLAIN LOGIN\r\n250 SIZE 1000000\r\n")
        if verb == b"DATA" and "DATA" not in script:
            script["data_mode"] = True
            return b"354 go ahead\r\n"
        if verb == b"QUIT":
            return None
        reply = script.get(verb.decode(), b"250 ok\r\n")
        return None if reply == b"hangup" else reply

    cases: list[LibCase] = []
    with ExitStack() as stack:
        listener, port = serve_lines(lambda: script["greeting"], answer)
        stack.callback(listener.close)

        def send(**replies: bytes):
            def run() -> None:
                script.clear()
                script["greeting"] = replies.pop("greeting", b"220 corpus ESMTP\r\n")
                script.update(replies)
                with smtplib.SMTP("127.0.0.1", port, timeout=3) as smtp:
                    if "AUTH" in replies:
                        smtp.login("app", "pw")
                    smtp.sendmail("pipeline@example.org", ["ops@example.org"], "Subject: done\r\n\r\nall done\r\n")
            return run

        for name, label, replies, how in [
            ("greeting-421", TRANSIENT, {"greeting": b"421 too busy, try later\r\n"}, "greets with 421"),
            ("greeting-554", PERMANENT, {"greeting": b"554 no SMTP service here\r\n"}, "greets with 554"),
            ("mail-451", TRANSIENT, {"MAIL": b"451 4.3.0 local error, try again\r\n"}, "answers MAIL FROM with 451"),
            ("mail-452", TRANSIENT, {"MAIL": b"452 4.3.1 insufficient storage\r\n"}, "answers MAIL FROM with 452"),
            ("mail-550", PERMANENT, {"MAIL": b"550 5.7.1 sender rejected\r\n"}, "answers MAIL FROM with 550"),
            ("rcpt-450", TRANSIENT, {"RCPT": b"450 4.2.1 mailbox busy\r\n"}, "answers RCPT TO with 450"),
            ("rcpt-451-greylisted", TRANSIENT, {"RCPT": b"451 4.7.1 greylisted, come back later\r\n"},
             "greylists RCPT TO with 451"),
            ("rcpt-550", PERMANENT, {"RCPT": b"550 5.1.1 no such user\r\n"}, "answers RCPT TO with 550"),
            ("rcpt-553", PERMANENT, {"RCPT": b"553 5.1.3 bad address syntax\r\n"}, "answers RCPT TO with 553"),
            ("data-451", TRANSIENT, {"DATA": b"451 4.3.0 try again later\r\n"}, "answers DATA with 451"),
            ("data-554", PERMANENT, {"DATA": b"554 5.6.0 transaction failed\r\n"}, "answers DATA with 554"),
            ("end-552", PERMANENT, {"END": b"552 5.3.4 message too big\r\n"}, "answers the message's end with 552"),
            ("end-421", TRANSIENT, {"END": b"421 4.4.2 timeout, closing\r\n"}, "answers the message's end with 421"),
            ("auth-535", PERMANENT, {"AUTH": b"535 5.7.8 bad credentials\r\n"}, "refuses AUTH with 535"),
            ("auth-454", TRANSIENT, {"AUTH": b"454 4.7.0 temporary authentication failure\r\n"},
             "refuses AUTH with 454"),
            ("mail-hangup", TRANSIENT, {"MAIL": b"hangup"}, "hangs up on MAIL FROM"),
        ]:
            cases.append(case(f"smtp-{name}", label, send(**replies), f"smtplib sendmail; the SMTP peer {how}"))

        def starttls() -> None:
            script.clear()
            script["greeting"] = b"220 corpus ESMTP\r\n"
            with smtplib.SMTP("127.0.0.1", port, timeout=3) as smtp:
                smtp.starttls()

        cases.append(case("smtp-no-starttls", PERMANENT, starttls,
                          "smtplib starttls() against a peer that does not offer STARTTLS: SMTPNotSupportedError"))
    cases.append(case("smtp-refused", TRANSIENT, lambda: smtplib.SMTP("127.0.0.1", _free_port(), timeout=2),
                      "smtplib connect to a closed port"))
    return cases


# -- kombu / RabbitMQ ----------------------------------------------------------------------------

def kombu_cases() -> list[LibCase]:
    import kombu

    url = "amqp://guest:guest@127.0.0.1:5672//"
    name = f"rx-corpus-{uuid.uuid4().hex[:8]}"

    def with_channel(body, connection_url: str = url):
        def run() -> None:
            with kombu.Connection(connection_url, connect_timeout=3) as conn:
                body(conn.channel(), conn)
        return run

    def exclusive_elsewhere() -> None:
        with kombu.Connection(url, connect_timeout=3) as owner:
            kombu.Queue(f"{name}-x", exclusive=True, channel=owner.channel()).declare()
            with kombu.Connection(url, connect_timeout=3) as other:
                kombu.Queue(f"{name}-x", exclusive=True, channel=other.channel()).declare()

    def redeclare(channel, conn) -> None:
        kombu.Queue(f"{name}-p", durable=False, auto_delete=True, channel=channel).declare()
        kombu.Queue(f"{name}-p", durable=True, auto_delete=True, channel=conn.channel()).declare()

    return [
        case("kombu-access-refused", PERMANENT,
             with_channel(lambda ch, conn: None, "amqp://guest:wrong@127.0.0.1:5672//"),
             "kombu connect to the local RabbitMQ with a wrong password: AccessRefused 403"),
        case("kombu-vhost-missing", PERMANENT,
             with_channel(lambda ch, conn: None, "amqp://guest:guest@127.0.0.1:5672/rx-no-such-vhost"),
             "kombu connect to a virtual host that does not exist: NotAllowed 530"),
        case("kombu-queue-not-found", PERMANENT,
             with_channel(lambda ch, conn: ch.queue_declare(queue=f"{name}-missing", passive=True)),
             "passive declare of a queue that does not exist: NotFound 404"),
        case("kombu-precondition", PERMANENT, with_channel(redeclare),
             "redeclaring a queue with another durability: PreconditionFailed 406"),
        case("kombu-resource-locked", TRANSIENT, exclusive_elsewhere,
             "declaring a queue another connection holds exclusively: ResourceLocked 405"),
        case("kombu-refused", TRANSIENT,
             lambda: kombu.Connection(f"amqp://guest:guest@127.0.0.1:{_free_port()}//", connect_timeout=1)
             .ensure_connection(max_retries=1, interval_start=0, interval_step=0),
             "kombu ensure_connection to a closed port: OperationalError"),
        case("kombu-exchange-not-found", PERMANENT,
             with_channel(lambda ch, conn: ch.exchange_declare(exchange=f"{name}-nope", type="direct", passive=True)),
             "passive declare of an exchange that does not exist: NotFound 404"),
    ]


# -- Celery ------------------------------------------------------------------------------------------

def celery_cases() -> list[LibCase]:
    from celery import Celery

    waiting = Celery("rx_corpus_wait", broker="redis://127.0.0.1:6379/15", backend="redis://127.0.0.1:6379/15")
    app = Celery("rx_corpus", broker="memory://", backend="cache+memory://")
    app.conf.update(task_always_eager=True, task_eager_propagates=True)

    @app.task(bind=True, max_retries=0)
    def flaky(self) -> None:
        self.retry(countdown=0)

    try:
        return [
            case("celery-result-timeout", TRANSIENT, lambda: waiting.AsyncResult(uuid.uuid4().hex).get(timeout=0.3),
                 "Celery AsyncResult.get(timeout=0.3) on the local Redis result backend, no worker: TimeoutError"),
            case("celery-max-retries", PERMANENT, lambda: flaky.apply(throw=True).get(),
                 "a bound Celery task with max_retries=0 calls self.retry(), run eagerly: MaxRetriesExceededError"),
            case("celery-not-registered", PERMANENT, lambda: app.tasks["rx.no_such_task"],
                 "looking up a task name the Celery app does not know: NotRegistered"),
        ]
    finally:
        app.close()
        waiting.close()


# -- exception groups and Dagster ---------------------------------------------------------------

def group_cases() -> list[LibCase]:
    async def gather(*bodies) -> None:
        async with asyncio.TaskGroup() as group:
            for body in bodies:
                group.create_task(body())

    async def refused() -> None:
        await asyncio.open_connection("127.0.0.1", _free_port())

    async def refused_at_once() -> None:  # fails in its first step, before a sibling's failure cancels it
        socket.create_connection(("127.0.0.1", _free_port()), timeout=1)

    async def bad_value() -> None:
        int("not a number")

    async def times_out() -> None:
        async with asyncio.timeout(0.05):
            await asyncio.sleep(1)

    async def nested() -> None:
        await gather(refused, times_out)

    return [
        case("group-all-refused", TRANSIENT, lambda: asyncio.run(gather(refused, refused)),
             "asyncio.TaskGroup of two connections to closed ports: ExceptionGroup of ConnectionRefusedError"),
        case("group-refused-and-bad-value", PERMANENT, lambda: asyncio.run(gather(refused_at_once, bad_value)),
             "asyncio.TaskGroup: one connection refused, one ValueError"),
        case("group-timeout-and-refused", TRANSIENT, lambda: asyncio.run(gather(times_out, refused)),
             "asyncio.TaskGroup: asyncio.timeout expiring and a connection refused"),
        case("group-nested", TRANSIENT, lambda: asyncio.run(gather(nested, refused)),
             "nested asyncio.TaskGroups whose leaves are all transient"),
    ]


def dagster_cases() -> list[LibCase]:
    from dagster import Failure, RetryRequested

    return [
        LibCase("dagster-retry-requested-bare", TRANSIENT, raised(lambda: _raise(RetryRequested(max_retries=3))),
                "raise RetryRequested(max_retries=3) as user code does", constructed=True),
        LibCase("dagster-failure-no-retries", PERMANENT,
                raised(lambda: _raise(Failure(description="bad input", allow_retries=False))),
                "raise Failure(allow_retries=False) as user code does", constructed=True),
    ]


def _raise(exc: BaseException) -> None:
    raise exc


def build_store_corpus(pg_url: str) -> list[LibCase]:
    started = time.monotonic()
    cases = (redis_cases() + mysql_cases() + asyncpg_cases(pg_url) + smtp_cases() + kombu_cases() + celery_cases()
             + group_cases()
             + dagster_cases())
    assert time.monotonic() - started < 240, "the store corpus took too long to build"
    return cases
