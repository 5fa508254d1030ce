//! The table of every `[pgbouncer]` and `[sluice]` key: its field type,
//! PgBouncer's default, how it is read and shown, whether it may change
//! while running, and a one-line description. Rows are sorted by key within
//! each section; the macro in `settings_macro` turns them into `Settings`.

use std::path::PathBuf;
use std::time::Duration;

use crate::choices::{AuthType, IoBackend, PoolMode, ReadYourWrites, RuntimeKind, SessionObjects};
use crate::codecs::{
    Choice, Count, Flag, List, OctalMode, OptionalPath, OptionalText, PeerId, Port, PositiveCount,
    Seconds, SslMode, Text, ThreadCount,
};
use crate::settings_macro::define_settings;

/// PgBouncer's default `auth_query`.
pub const DEFAULT_AUTH_QUERY: &str = "SELECT rolname, CASE WHEN rolvaliduntil < now() \
     THEN NULL ELSE rolpassword END FROM pg_authid WHERE rolname=$1 AND rolcanlogin";

/// `tcp_defer_accept` is on by default where the socket option exists.
const DEFAULT_TCP_DEFER_ACCEPT: &str = if cfg!(target_os = "linux") { "1" } else { "0" };
const DEFAULT_TCP_DEFER_ACCEPT_VALUE: u32 = if cfg!(target_os = "linux") { 1 } else { 0 };

fn text(value: &str) -> String {
    value.to_string()
}

const fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

define_settings! {
    pgbouncer {
        admin_users: Vec<String> = Vec::new() => "", List, reload,
            "Comma-separated users allowed to run every admin console command.";
        application_name_add_host: bool = false => "0", Flag, reload,
            "Append the client's address and port to application_name at connect.";
        auth_dbname: Option<String> = None => "", OptionalText, reload,
            "Database in which auth_query runs, unless a database entry sets its own.";
        auth_file: Option<PathBuf> = None => "", OptionalPath, reload,
            "File of user names and passwords; a relative path is taken from the ini file's \
             directory.";
        auth_hba_file: Option<PathBuf> = None => "", OptionalPath, reload,
            "pg_hba.conf-style rules used when auth_type is hba; relative to the ini file's \
             directory.";
        auth_ident_file: Option<PathBuf> = None => "", OptionalPath, reload,
            "Ident user-name map used with auth_type hba; relative to the ini file's directory.";
        auth_ldap_options: String = String::new() => "", Text, reload,
            "LDAP connection options used when auth_type is ldap.";
        auth_query: String = text(DEFAULT_AUTH_QUERY) => DEFAULT_AUTH_QUERY, Text, reload,
            "Query run as auth_user to look up the password of a user missing from auth_file.";
        auth_type: AuthType = AuthType::Md5 => "md5", Choice<AuthType>, reload,
            "Client authentication: any, trust, plain, md5, scram-sha-256, cert, hba, pam or ldap.";
        auth_user: Option<String> = None => "", OptionalText, reload,
            "User that runs auth_query for users not found in auth_file.";
        autodb_idle_timeout: Duration = secs(3600) => "3600", Seconds, reload,
            "Free pools created from the \"*\" entry after this long unused. (seconds)";
        cancel_wait_timeout: Duration = secs(10) => "10", Seconds, reload,
            "Drop a cancel request not forwarded to a server (or a peer) within this time; 0 \
             leaves only server_connect_timeout (15 s towards a peer) as the bound. (seconds)";
        client_idle_timeout: Duration = Duration::ZERO => "0", Seconds, reload,
            "Close client connections idle longer than this; 0 disables. (seconds)";
        client_login_timeout: Duration = secs(60) => "60", Seconds, reload,
            "Disconnect clients that have not logged in within this time. (seconds)";
        client_tls13_ciphers: String = String::new() => "", Text, reload,
            "TLS 1.3 cipher suites for client connections (names as OpenSSL or the RFC give them); empty: all.";
        client_tls_ca_file: String = String::new() => "", Text, reload,
            "CA certificates that validate client certificates (verify-ca, verify-full).";
        client_tls_cert_file: String = String::new() => "", Text, reload,
            "Certificate chain (PEM) presented to clients.";
        client_tls_ciphers: String = text("default") => "default", Text, reload,
            "TLS 1.2 ciphers for clients: keywords keep all rustls suites, named suites restrict.";
        client_tls_dheparams: String = text("auto") => "auto", Text, reload,
            "DHE key exchange for clients: none, auto or legacy (rustls has ECDHE only).";
        client_tls_ecdhcurve: String = text("auto") => "auto", Text, reload,
            "ECDH curves for clients: auto, or x25519, prime256v1, secp384r1.";
        client_tls_key_file: String = String::new() => "", Text, reload,
            "Private key (PEM) for client connections.";
        client_tls_protocols: String = text("secure") => "secure", Text, reload,
            "TLS versions for clients: secure, tlsv1.2, tlsv1.3 (rustls has no 1.0/1.1).";
        client_tls_sslmode: String = text("disable") => "disable", SslMode, reload,
            "TLS mode for clients: disable, allow, prefer, require, verify-ca, verify-full.";
        conffile: String = String::new() => "", Text, reload,
            "The configuration file; the reader sets it to the file it loaded.";
        default_pool_size: u32 = 20 => "20", Count, reload,
            "Server connections per user/database pair unless a database or user entry sets \
             pool_size.";
        disable_pqexec: bool = false => "0", Flag, reload,
            "Refuse the simple query protocol, so one message cannot carry several statements.";
        dns_max_ttl: Duration = secs(15) => "15", Seconds, reload,
            "How long a successful DNS lookup is cached. (seconds)";
        dns_nxdomain_ttl: Duration = secs(15) => "15", Seconds, reload,
            "How long a failed DNS lookup is cached. (seconds)";
        dns_zone_check_period: Duration = Duration::ZERO => "0", Seconds, reload,
            "How often to check DNS zone serials for changes; PgBouncer does it only with c-ares, \
             sluice not at all: any value but 0 is refused at startup. (seconds)";
        idle_transaction_timeout: Duration = Duration::ZERO => "0", Seconds, reload,
            "Disconnect clients idle inside a transaction longer than this; 0 disables. (seconds)";
        ignore_startup_parameters: Vec<String> = Vec::new() => "", List, reload,
            "Comma-separated startup parameters to accept from clients and ignore. Any other \
             parameter PostgreSQL does not report (search_path, extra_float_digits, …) becomes \
             the client's session setting, applied on every server it is given.";
        job_name: String = text("pgbouncer") => "pgbouncer", Text, fixed,
            "Service name (Windows service registration); service_name is an alias.";
        listen_addr: String = String::new() => "", Text, fixed,
            "Comma-separated addresses to listen on for TCP; * means all; empty means Unix socket \
             only.";
        listen_backlog: u32 = 128 => "128", Count, fixed,
            "Backlog passed to listen(2).";
        listen_port: u16 = 6432 => "6432", Port, fixed,
            "Port to listen on, for TCP and for the Unix socket's name (1-65535).";
        log_connections: bool = true => "1", Flag, reload,
            "Log successful client logins.";
        log_disconnections: bool = true => "1", Flag, reload,
            "Log disconnections and their reasons.";
        log_pooler_errors: bool = true => "1", Flag, reload,
            "Log the errors the pooler sends to clients.";
        log_stats: bool = true => "1", Flag, reload,
            "Log aggregated statistics every stats_period.";
        logfile: String = String::new() => "", Text, reload,
            "File to log to, besides stderr; empty means none. Opened again by every RELOAD or SIGHUP (after log rotation), at the path named then.";
        login_notify_message: String = String::new() => "", Text, reload,
            "Notice sent to clients right after they log in; empty sends none.";
        max_client_conn: u32 = 100 => "100", PositiveCount, reload,
            "Most client connections accepted at once (at least 1).";
        max_db_client_connections: u32 = 0 => "0", Count, reload,
            "Most client connections per database, across users; 0 means unlimited.";
        max_db_connections: u32 = 0 => "0", Count, reload,
            "Most server connections per database, across users; 0 means unlimited.";
        max_packet_size: u32 = 2147483647 => "2147483647", Count, reload,
            "Largest protocol message let through, in bytes.";
        max_prepared_statements: u32 = 200 => "200", Count, reload,
            "Shared prepared statements kept per server connection in transaction and statement \
             mode (least recently used closed first); clients' named statements follow them to \
             any server. 0 passes statement names through unchanged, as PgBouncer before 1.21.";
        max_user_client_connections: u32 = 0 => "0", Count, reload,
            "Most client connections per user, across databases; 0 means unlimited.";
        max_user_connections: u32 = 0 => "0", Count, reload,
            "Most server connections per user, across databases; 0 means unlimited.";
        min_pool_size: u32 = 0 => "0", Count, reload,
            "Keep at least this many server connections open per pool; 0 disables.";
        peer_id: u32 = 0 => "0", PeerId, fixed,
            "This process's id among peered poolers (0-16383); 0 disables peering.";
        pidfile: String = String::new() => "", Text, fixed,
            "File the process id is written to; needed to run as a daemon.";
        pkt_buf: u32 = 4096 => "4096", Count, fixed,
            "Size of the internal packet buffers, in bytes.";
        pool_idle_timeout: Duration = Duration::ZERO => "0", Seconds, reload,
            "Free a pool with no clients and no servers after this long; 0 disables. (seconds)";
        pool_mode: PoolMode = PoolMode::Session => "session", Choice<PoolMode>, reload,
            "When a server connection returns to the pool: session, transaction or statement.";
        query_timeout: Duration = Duration::ZERO => "0", Seconds, reload,
            "End a client (08P01 `query timeout`) whose request runs longer than this, closing \
             its server; 0 disables. (seconds)";
        query_wait_notify: Duration = Duration::ZERO => "0", Seconds, reload,
            "Tell a queued client it is waiting after this long; 0 disables. PgBouncer's \
             default is 5; sluice's is 0 because the notice costs about 1 µs of CPU per \
             transaction that waits (6 % with 150 clients on 20 servers). (seconds)";
        query_wait_timeout: Duration = secs(120) => "120", Seconds, reload,
            "Disconnect a client whose query waited this long for a server; 0 waits forever. \
             (seconds)";
        reserve_pool_size: u32 = 0 => "0", Count, reload,
            "Extra server connections a pool may open when clients wait too long; 0 disables.";
        reserve_pool_timeout: Duration = secs(5) => "5", Seconds, reload,
            "How long a client waits before the reserve pool is used; 0 disables. (seconds)";
        resolv_conf: String = String::new() => "", Text, fixed,
            "A resolv.conf to use instead of the system's (c-ares only in PgBouncer): sluice uses \
             the system resolver and refuses any other value at startup.";
        sbuf_loopcnt: u32 = 5 => "5", Count, reload,
            "Buffers processed on one connection before turning to others; 0 means no limit.";
        scram_iterations: u32 = 4096 => "4096", Count, reload,
            "Iterations used when computing a SCRAM-SHA-256 secret.";
        server_check_delay: Duration = secs(30) => "30", Seconds, reload,
            "Reuse a released server connection without server_check_query within this time; 0 \
             always checks. (seconds)";
        server_check_query: String = text("<empty>") => "<empty>", Text, reload,
            "Query that checks an idle server connection is alive; empty disables, `<empty>` sends \
             an empty query (PgBouncer 1.25's default; 1.18's was `select 1`).";
        server_connect_timeout: Duration = secs(15) => "15", Seconds, reload,
            "Give up on a server connection and login not done in this time. (seconds)";
        server_fast_close: bool = false => "0", Flag, reload,
            "In session mode, close servers marked for reconnect at the end of the transaction, \
             not the session.";
        server_idle_timeout: Duration = secs(600) => "600", Seconds, reload,
            "Close server connections idle longer than this; 0 disables. (seconds)";
        server_lifetime: Duration = secs(3600) => "3600", Seconds, reload,
            "Close an unused server connection older than this; 0 uses each connection once. \
             (seconds)";
        server_login_retry: Duration = secs(15) => "15", Seconds, reload,
            "After a failed server connect or login, wait this long before trying again. (seconds)";
        server_reset_query: String = text("DISCARD ALL") => "DISCARD ALL", Text, reload,
            "Query run on a server connection released by a session-mode client.";
        server_reset_query_always: bool = false => "0", Flag, reload,
            "Run server_reset_query in every pool mode, not only session mode.";
        server_round_robin: bool = false => "0", Flag, reload,
            "Use idle server connections in turn (FIFO) instead of most-recent first (LIFO).";
        server_tls13_ciphers: String = String::new() => "", Text, reload,
            "TLS 1.3 cipher suites towards servers; empty: all.";
        server_tls_ca_file: String = String::new() => "", Text, reload,
            "CA certificates that validate server certificates (verify-ca, verify-full).";
        server_tls_cert_file: String = String::new() => "", Text, reload,
            "Client certificate chain (PEM) presented to servers.";
        server_tls_ciphers: String = text("default") => "default", Text, reload,
            "TLS 1.2 ciphers towards servers: keywords keep all rustls suites, named suites restrict.";
        server_tls_key_file: String = String::new() => "", Text, reload,
            "Private key (PEM) for the client certificate presented to servers.";
        server_tls_protocols: String = text("secure") => "secure", Text, reload,
            "TLS versions towards servers: secure, tlsv1.2, tlsv1.3.";
        server_tls_sslmode: String = text("prefer") => "prefer", SslMode, reload,
            "TLS mode towards servers, with libpq's meanings: disable, allow, prefer, require, \
             verify-ca, verify-full.";
        so_reuseport: bool = false => "0", Flag, fixed,
            "Set SO_REUSEPORT on listening sockets so several processes can share the port.";
        stats_period: Duration = secs(60) => "60", Seconds, reload,
            "How often averages are computed and statistics logged. (seconds)";
        stats_users: Vec<String> = Vec::new() => "", List, reload,
            "Comma-separated users allowed to run the admin console's SHOW commands.";
        suspend_timeout: Duration = secs(10) => "10", Seconds, reload,
            "How long SUSPEND and online restart wait for buffers to flush. (seconds)";
        syslog: bool = false => "0", Flag, reload,
            "Also log to syslog.";
        syslog_facility: String = text("daemon") => "daemon", Text, reload,
            "Syslog facility: auth, authpriv, daemon, user or local0-7.";
        syslog_ident: String = text("pgbouncer") => "pgbouncer", Text, reload,
            "Program name given to syslog.";
        tcp_defer_accept: u32 = DEFAULT_TCP_DEFER_ACCEPT_VALUE
            => DEFAULT_TCP_DEFER_ACCEPT, Count, fixed,
            "Set TCP_DEFER_ACCEPT on listening sockets (Linux); nonzero enables.";
        tcp_keepalive: bool = true => "1", Flag, reload,
            "Turn on TCP keepalive, with the OS defaults unless tcp_keep* are set.";
        tcp_keepcnt: u32 = 0 => "0", Count, reload,
            "Keepalive probes before the connection is dropped; 0 keeps the OS default.";
        tcp_keepidle: u32 = 0 => "0", Count, reload,
            "Idle seconds before keepalive probes start; 0 keeps the OS default.";
        tcp_keepintvl: u32 = 0 => "0", Count, reload,
            "Seconds between keepalive probes; 0 keeps the OS default.";
        tcp_socket_buffer: u32 = 0 => "0", Count, reload,
            "Socket send and receive buffer size in bytes; 0 keeps the OS default.";
        tcp_user_timeout: u32 = 0 => "0", Count, reload,
            "TCP_USER_TIMEOUT in milliseconds (Linux); 0 keeps the OS default.";
        track_extra_parameters: Vec<String> = vec![text("IntervalStyle")]
            => "IntervalStyle", List, fixed,
            "Comma-separated parameters tracked per client beyond client_encoding, datestyle, \
             timezone, standard_conforming_strings and application_name. sluice tracks every \
             startup parameter, `options=-c` setting and SET of each client anyway (read back \
             from the server after a transaction that may change one), so those listed here are \
             tracked too.";
        transaction_timeout: Duration = Duration::ZERO => "0", Seconds, reload,
            "Disconnect clients whose transaction has been open longer than this; 0 disables. \
             (seconds)";
        unix_socket_dir: String = text("/tmp") => "/tmp", Text, fixed,
            "Directory of the Unix socket; empty disables it; a leading @ means the abstract \
             namespace.";
        unix_socket_group: String = String::new() => "", Text, fixed,
            "Group owning the Unix socket.";
        unix_socket_mode: u32 = 0o777 => "0777", OctalMode, fixed,
            "File mode of the Unix socket, in octal.";
        user: String = String::new() => "", Text, fixed,
            "Unix user to switch to after startup, when started as root.";
        verbose: u32 = 0 => "0", Count, fixed,
            "Log verbosity; each step adds detail (like -v on the command line).";
    }
    sluice {
        failover_hold: Duration = secs(10) => "10", Seconds, reload,
            "A database that routes reads and has no reachable primary (a failover under way) \
             holds new transactions that need the primary up to this long, until checks find \
             the new primary, instead of failing them; reads keep going to replicas. 0 fails \
             them at once. (seconds)";
        health_check_period: Duration = Duration::from_millis(250) => "0.25", Seconds, reload,
            "How often sluice checks each host of a database entry that names several hosts or \
             routes reads: reachability, role (pg_is_in_recovery), timeline and WAL position. \
             Lag in time is measured against these samples, so keep it under a second. (seconds)";
        health_check_threshold: u32 = 3 => "3", PositiveCount, reload,
            "Consecutive failed checks that take a host out of rotation, and consecutive good \
             ones that put it back.";
        health_check_timeout: Duration = secs(2) => "2", Seconds, reload,
            "A check (connect and query) that takes longer than this fails. (seconds)";
        io_backend: IoBackend = IoBackend::Auto => "auto", Choice<IoBackend>, fixed,
            "How per_core workers send: io_uring (the sends of one turn of a worker's event \
             loop go to the kernel in one io_uring_enter, not one sendto each), epoll (one \
             sendto per message), or auto: io_uring where the kernel allows it (it may be \
             disabled by kernel.io_uring_disabled or a container's seccomp profile), else \
             epoll. The choice is logged at startup and shown by SHOW CONFIG.";
        max_held_memory_mb: u32 = 1024 => "1024", Count, reload,
            "Most memory, in MiB, that all clients' large messages (while sluice holds them \
             whole: transaction and statement mode read a Parse, Bind, Describe, Close, Query \
             or FunctionCall whole before sending it, up to 64 MiB each; one of up to 256 KiB \
             takes nothing from this) and the texts of prepared statements may take \
             together. A client whose message would pass it is refused with 53200 and \
             disconnected, a Parse of a new text fails with 53200; the others go on. A \
             message may take up to twice its size while it is forwarded. 0 means unlimited.";
        metrics_addr: Option<String> = None => "", OptionalText, fixed,
            "Address (host:port) to serve Prometheus metrics on; empty disables.";
        read_your_writes: ReadYourWrites = ReadYourWrites::Session => "session",
            Choice<ReadYourWrites>, reload,
            "With route_reads: after a client's transaction that wrote, its reads go only to a \
             replica that has replayed past the primary's first check after that commit, else \
             to the primary (session); every client's reads wait so for the writes of every \
             client of the same database entry that ended before the read began (database: \
             for applications that write on one connection and read on another; each write \
             transaction costs one more round trip on the primary); or reads go to any replica \
             within the lag limits (off).";
        replica_max_lag: Duration = secs(1) => "1", Seconds, reload,
            "Reads go only to replicas whose replay is at most this far behind the primary, \
             measured in time. (seconds)";
        replica_max_lag_bytes: u32 = 16 * 1024 * 1024 => "16777216", Count, reload,
            "Reads go only to replicas whose replay is at most this many bytes of WAL behind \
             the primary.";
        route_reads: bool = false => "0", Flag, reload,
            "Transaction and statement mode: send transactions that only read to a replica of \
             the database entry's hosts (roles are found with pg_is_in_recovery). Off, every \
             transaction goes to the first host, as PgBouncer does. A database entry may \
             override it (route_reads=1).";
        runtime: RuntimeKind = RuntimeKind::PerCore => "per_core", Choice<RuntimeKind>, fixed,
            "Runtime layout: per_core (one single-threaded runtime per worker) or shared (one \
             multi-threaded runtime).";
        track_session_objects: SessionObjects = SessionObjects::Pin => "pin",
            Choice<SessionObjects>, reload,
            "Transaction and statement mode: a client that leaves a temporary table, a WITH HOLD \
             cursor or a session advisory lock on its server keeps that server until the object \
             is gone (pin), or the object is removed when the transaction ends (discard). \
             Pinned clients show in SHOW CLIENTS and /metrics.";
        web_console: bool = false => "0", Flag, reload,
            "Serve the web console (/) and its JSON API (/api/…) on metrics_addr: live pools, \
             databases, clients and hosts, and databases created, resized, paused and removed \
             at run time. HTTP Basic with an admin_users (changes) or stats_users (read-only) \
             name and its auth_file password.";
        web_console_file: String = String::new() => "", Text, fixed,
            "The [databases] file the web console owns: read with the configuration, rewritten \
             atomically when the API changes a database; empty means sluice-web.ini next to the \
             configuration file.";
        workers: usize = 0 => "0", ThreadCount, fixed,
            "Worker threads; 0 means one per CPU.";
        worker_busy_percent: u32 = 80 => "80", Count, reload,
            "per_core layout: every worker is started, but only the first accepts clients at \
             first; the next starts accepting when those accepting are this busy (percent of one \
             CPU over 2 s). A lone worker batches more events per wakeup and so spends less CPU \
             per transaction than two half-busy ones. 0 makes every worker accept from the start.";
    }
}
