package compat;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.lang.reflect.Field;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.Properties;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import org.postgresql.core.CachedQuery;
import org.postgresql.PGStatement;

/** Connections, assertions and worker threads shared by the scenarios. */
final class Db {
    private Db() {}

    static final String HOST = env("PGHOST");
    static final String PORT = env("PGPORT");
    static final String USER = env("PGUSER");
    static final String PASSWORD = env("PGPASSWORD");
    static final String DATABASE = env("PGDATABASE");
    static final String DIRECT_PORT = env("COMPAT_DIRECT_PORT");
    static final String RESTART_CMD = env("COMPAT_RESTART_CMD");

    /** The schema holding the suite's shared tables. */
    static final String SCHEMA = "java_compat";

    static String env(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) {
            throw new IllegalStateException("environment variable " + name + " is not set");
        }
        return v;
    }

    static String url(String port) {
        return "jdbc:postgresql://" + HOST + ":" + port + "/" + DATABASE;
    }

    /**
     * How the driver is configured for one pass over the scenarios: pgjdbc's
     * defaults, optionally with a different prepareThreshold.
     */
    record Mode(String name, String prepareThreshold, int threshold) {
        Properties props() {
            Properties p = new Properties();
            p.setProperty("user", USER);
            p.setProperty("password", PASSWORD);
            if (prepareThreshold != null) {
                p.setProperty("prepareThreshold", prepareThreshold);
            }
            return p;
        }
    }

    /** A connection through the target (sluice, or PostgreSQL in direct mode), outside any pool. */
    static Connection connect(Mode m) throws SQLException {
        return DriverManager.getConnection(url(PORT), m.props());
    }

    /** An out-of-band connection to PostgreSQL itself, for setup and for checking what really got committed. */
    static Connection admin() throws SQLException {
        Properties p = new Properties();
        p.setProperty("user", USER);
        p.setProperty("password", PASSWORD);
        p.setProperty("ApplicationName", "java-compat-admin");
        return DriverManager.getConnection(url(DIRECT_PORT), p);
    }

    /** Runs statements on PostgreSQL directly (autocommit). */
    static void adminExec(String... sqls) throws SQLException {
        try (Connection c = admin(); Statement st = c.createStatement()) {
            for (String sql : sqls) {
                st.execute(sql);
            }
        }
    }

    /** One long value from PostgreSQL directly. */
    static long adminLong(String sql) throws SQLException {
        try (Connection c = admin(); Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            check(rs.next(), "no row from " + sql);
            return rs.getLong(1);
        }
    }

    static String adminString(String sql) throws SQLException {
        try (Connection c = admin(); Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            check(rs.next(), "no row from " + sql);
            return rs.getString(1);
        }
    }

    /** A HikariCP pool of {@code size} connections through the target. */
    static HikariDataSource pool(Mode m, String name, int size) {
        HikariConfig c = new HikariConfig();
        c.setJdbcUrl(url(PORT));
        c.setUsername(USER);
        c.setPassword(PASSWORD);
        c.setPoolName("java-" + name);
        c.setMaximumPoolSize(size);
        c.setMinimumIdle(size);
        c.setConnectionTimeout(15_000);
        if (m.prepareThreshold() != null) {
            c.addDataSourceProperty("prepareThreshold", m.prepareThreshold());
        }
        return new HikariDataSource(c);
    }

    /** Closes a pool without letting a wedged connection stall the suite. */
    static void closeQuietly(HikariDataSource ds) {
        if (ds == null) {
            return;
        }
        Thread t = new Thread(ds::close, "compat-close-" + ds.getPoolName());
        t.setDaemon(true);
        t.start();
        try {
            t.join(15_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    static void closeQuietly(AutoCloseable c) {
        if (c == null) {
            return;
        }
        try {
            c.close();
        } catch (Exception ignored) {
            // best effort
        }
    }

    /**
     * After an unexpected error: drops the connection at once (abort, no
     * round trip), so whatever it holds, e.g. an open transaction pinning one
     * of sluice's server connections, is released; the pool replaces it.
     */
    static void abandon(Connection c) {
        if (c == null) {
            return;
        }
        try {
            c.unwrap(Connection.class).abort(Runnable::run);
        } catch (Exception ignored) {
            // already gone
        }
    }

    /** Rolls back after an error; if even that fails, abandons the connection. */
    static void rollbackOrAbandon(Connection c) {
        try {
            if (c != null && !c.isClosed() && !c.getAutoCommit()) {
                c.rollback();
            }
        } catch (SQLException e) {
            abandon(c);
        }
    }

    // ---- pgjdbc internals, read-only: which server-side statement a PreparedStatement uses ----

    private static final Field PREPARED_QUERY;
    private static final Field STATEMENT_NAME;

    static {
        try {
            PREPARED_QUERY = Class.forName("org.postgresql.jdbc.PgPreparedStatement").getDeclaredField("preparedQuery");
            PREPARED_QUERY.setAccessible(true);
            STATEMENT_NAME = Class.forName("org.postgresql.core.v3.SimpleQuery").getDeclaredField("statementName");
            STATEMENT_NAME.setAccessible(true);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    /**
     * The name of the server-side prepared statement pgjdbc uses for {@code ps}
     * on its connection ({@code S_1}, {@code S_2}, …), or null while pgjdbc
     * still sends it as an unnamed statement (fewer than prepareThreshold
     * executions on this connection).
     */
    static String statementName(PreparedStatement ps) {
        try {
            PGStatement p = ps.unwrap(PGStatement.class);
            CachedQuery cq = (CachedQuery) PREPARED_QUERY.get(p);
            Object q = cq.query;
            if (!STATEMENT_NAME.getDeclaringClass().isInstance(q)) {
                return null;
            }
            return (String) STATEMENT_NAME.get(q);
        } catch (SQLException | IllegalAccessException e) {
            throw new IllegalStateException("cannot read pgjdbc's statement name", e);
        }
    }

    /** Asserts that pgjdbc executed {@code ps} as a named server-side statement. */
    static String requireNamed(PreparedStatement ps, String what) {
        String name = statementName(ps);
        if (name == null || !name.startsWith("S_")) {
            throw new Failure("pgjdbc did not use a named server-side statement for " + what + " (name " + name + ")");
        }
        return name;
    }

    // ---- queries ----

    static long queryLong(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            check(rs.next(), "no row from " + sql);
            return rs.getLong(1);
        }
    }

    static String queryString(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            check(rs.next(), "no row from " + sql);
            return rs.getString(1);
        }
    }

    static void exec(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement()) {
            st.execute(sql);
        }
    }

    static long psLong(PreparedStatement ps) throws SQLException {
        try (ResultSet rs = ps.executeQuery()) {
            check(rs.next(), "no row");
            long v = rs.getLong(1);
            check(!rs.next(), "more than one row");
            return v;
        }
    }

    // ---- assertions ----

    /** A failed expectation (as opposed to an unexpected exception). */
    static final class Failure extends RuntimeException {
        Failure(String message) {
            super(message);
        }
    }

    static void check(boolean ok, String message) {
        if (!ok) {
            throw new Failure(message);
        }
    }

    static void eq(Object expected, Object actual, String what) {
        if (!Objects.equals(expected, actual)) {
            throw new Failure(what + ": expected <" + expected + "> but got <" + actual + ">");
        }
    }

    /** Asserts that {@code e} carries SQLSTATE {@code state}. */
    static void expectState(SQLException e, String state, String what) {
        if (!state.equals(e.getSQLState())) {
            throw new Failure(what + ": expected SQLSTATE " + state + " but got " + describe(e));
        }
    }

    interface SqlAction {
        void run() throws Exception;
    }

    /** Runs {@code action}, which must fail with SQLSTATE {@code state}. */
    static SQLException expectError(String state, String what, SqlAction action) throws Exception {
        try {
            action.run();
        } catch (SQLException e) {
            expectState(e, state, what);
            return e;
        }
        throw new Failure(what + ": expected SQLSTATE " + state + " but it succeeded");
    }

    /** One line: SQLSTATE and message for SQL errors, class and message otherwise. */
    static String describe(Throwable t) {
        if (t instanceof Failure) {
            return t.getMessage();
        }
        String msg = String.valueOf(t.getMessage()).replaceAll("\\s*\\n\\s*", " | ");
        if (t instanceof SQLException s) {
            return "SQLSTATE " + s.getSQLState() + ": " + msg;
        }
        return t.getClass().getSimpleName() + ": " + msg;
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new Failure("interrupted");
        }
    }

    // ---- worker threads ----

    /** Collects errors from many threads; reports the first few. */
    static final class Errors {
        private final ConcurrentLinkedQueue<String> messages = new ConcurrentLinkedQueue<>();
        private final AtomicInteger count = new AtomicInteger();

        void add(String message) {
            if (count.incrementAndGet() <= 200) {
                messages.add(message);
            }
        }

        boolean isEmpty() {
            return count.get() == 0;
        }

        void throwIfAny(String what) {
            int n = count.get();
            if (n == 0) {
                return;
            }
            StringBuilder sb = new StringBuilder();
            sb.append(what).append(": ").append(n).append(n == 1 ? " error" : " errors");
            List<String> shown = new ArrayList<>();
            for (String m : messages) {
                if (shown.size() == 8) {
                    break;
                }
                shown.add(m);
            }
            for (String m : shown) {
                sb.append("\n    ").append(m);
            }
            if (n > shown.size()) {
                sb.append("\n    … and ").append(n - shown.size()).append(" more");
            }
            throw new Failure(sb.toString());
        }
    }

    interface WorkerBody {
        void run(int worker) throws Exception;
    }

    /**
     * Runs {@code n} workers at once and waits for them (at most
     * {@code deadlineMs}); each worker stops at its first error. Throws a
     * {@link Failure} listing the errors.
     */
    static void runWorkers(String what, int n, long deadlineMs, WorkerBody body) {
        Errors errors = new Errors();
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            final int w = i;
            Thread t = new Thread(() -> {
                try {
                    body.run(w);
                } catch (Throwable e) {
                    errors.add("worker " + w + ": " + describe(e));
                }
            }, "compat-" + what + "-" + w);
            t.setDaemon(true);
            threads.add(t);
        }
        threads.forEach(Thread::start);
        long end = System.currentTimeMillis() + deadlineMs;
        for (int i = 0; i < n; i++) {
            Thread t = threads.get(i);
            try {
                t.join(Math.max(1, end - System.currentTimeMillis()));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new Failure("interrupted");
            }
            if (t.isAlive()) {
                errors.add("worker " + i + ": still running after " + deadlineMs / 1000 + " s, at "
                        + Main.topFrames(t, 4));
            }
        }
        errors.throwIfAny(what);
    }
}
