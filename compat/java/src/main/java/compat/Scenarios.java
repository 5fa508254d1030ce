package compat;

import static compat.Db.SCHEMA;
import static compat.Db.abandon;
import static compat.Db.adminExec;
import static compat.Db.adminLong;
import static compat.Db.adminString;
import static compat.Db.check;
import static compat.Db.closeQuietly;
import static compat.Db.connect;
import static compat.Db.describe;
import static compat.Db.eq;
import static compat.Db.exec;
import static compat.Db.expectError;
import static compat.Db.pool;
import static compat.Db.psLong;
import static compat.Db.queryLong;
import static compat.Db.queryString;
import static compat.Db.requireNamed;
import static compat.Db.rollbackOrAbandon;
import static compat.Db.runWorkers;
import static compat.Db.sleep;
import static compat.Db.statementName;

import com.zaxxer.hikari.HikariDataSource;
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.io.StringReader;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Savepoint;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import org.postgresql.PGConnection;
import org.postgresql.PGNotification;
import org.postgresql.copy.CopyManager;

/** The eight scenarios every compat suite runs, with pgjdbc and HikariCP. */
final class Scenarios {
    private Scenarios() {}

    /** HikariCP pool size for the multi-worker scenarios (sluice has 4 server connections behind it). */
    static final int POOL = 16;

    private static void resetTable(String table, String columns) throws SQLException {
        adminExec("create schema if not exists " + SCHEMA,
                "drop table if exists " + SCHEMA + "." + table,
                "create table " + SCHEMA + "." + table + " (" + columns + ")");
    }

    // ------------------------------------------------------------------
    // 1. Many concurrent workers
    // ------------------------------------------------------------------

    static void concurrentWorkers(Db.Mode m) throws Exception {
        resetTable("s1_items", "worker int not null, seq int not null, v int not null, primary key (worker, seq)");
        final int workers = 24;
        final int iterations = 240;
        AtomicLong expectedSum = new AtomicLong();
        AtomicLong named = new AtomicLong();
        String insert = "insert into java_compat.s1_items (worker, seq, v) values (?, ?, ?)";
        HikariDataSource ds = pool(m, "s1", POOL);
        try {
            runWorkers("s1", workers, 50_000, w -> {
                ThreadLocalRandom rnd = ThreadLocalRandom.current();
                int inserted = 0;
                for (int i = 0; i < iterations; i++) {
                    int x = rnd.nextInt(-1_000_000, 1_000_000);
                    try (Connection c = ds.getConnection()) {
                        switch (i % 3) {
                            case 0 -> {
                                // autocommit: a parameterized select
                                try (PreparedStatement ps = c.prepareStatement("select ?::int + 1")) {
                                    ps.setInt(1, x);
                                    eq((long) x + 1, psLong(ps), "select $1::int + 1 with $1=" + x);
                                    if (statementName(ps) != null) {
                                        named.incrementAndGet();
                                    }
                                }
                            }
                            case 1 -> {
                                // explicit transaction: insert, then read our own rows back inside it
                                c.setAutoCommit(false);
                                try (PreparedStatement ins = c.prepareStatement(insert);
                                        PreparedStatement cnt = c.prepareStatement(
                                                "select count(*) from java_compat.s1_items where worker = ?")) {
                                    ins.setInt(1, w);
                                    ins.setInt(2, i);
                                    ins.setInt(3, x);
                                    eq(1, ins.executeUpdate(), "insert row count");
                                    cnt.setInt(1, w);
                                    eq((long) inserted + 1, psLong(cnt), "worker's rows seen inside its transaction");
                                    c.commit();
                                } catch (Exception e) {
                                    abandon(c);
                                    throw e;
                                }
                                c.setAutoCommit(true);
                                inserted++;
                                expectedSum.addAndGet(x);
                            }
                            default -> {
                                // autocommit insert
                                try (PreparedStatement ins = c.prepareStatement(insert)) {
                                    ins.setInt(1, w);
                                    ins.setInt(2, i);
                                    ins.setInt(3, x);
                                    eq(1, ins.executeUpdate(), "insert row count");
                                }
                                inserted++;
                                expectedSum.addAndGet(x);
                            }
                        }
                    }
                }
            });
        } finally {
            closeQuietly(ds);
        }
        long perWorker = 0;
        for (int i = 0; i < iterations; i++) {
            if (i % 3 != 0) {
                perWorker++;
            }
        }
        eq(workers * perWorker, adminLong("select count(*) from java_compat.s1_items"), "rows committed");
        eq(0L, adminLong("select count(*) from (select worker from java_compat.s1_items group by worker having count(*) <> "
                + perWorker + ") w"), "workers with a wrong number of rows");
        eq(expectedSum.get(), adminLong("select coalesce(sum(v::bigint), 0) from java_compat.s1_items"), "sum of inserted values");
        check(named.get() > 0, "pgjdbc never switched to a named server-side statement (prepareThreshold " + m.threshold() + ")");
    }

    // ------------------------------------------------------------------
    // 2. Named prepared statements reused across transactions
    // ------------------------------------------------------------------

    static final String SQL_A = "select ?::int * 2 as doubled, 'a'::text as tag";
    static final String SQL_B = "select ?::text || '-b' as s, ?::int + 100 as n, 'b'::text as tag";
    static final String SQL_C = "insert into java_compat.s2_log (worker, seq, a, b) values (?, ?, ?, ?)";

    private static int runA(PreparedStatement ps, int x) throws SQLException {
        ps.setInt(1, x);
        try (ResultSet rs = ps.executeQuery()) {
            eq(2, rs.getMetaData().getColumnCount(), "columns of statement A");
            check(rs.next(), "statement A returned no row");
            eq(x * 2, rs.getInt(1), "statement A doubled");
            eq("a", rs.getString(2), "statement A tag");
            check(!rs.next(), "statement A returned more than one row");
            return x * 2;
        }
    }

    private static int runB(PreparedStatement ps, int x) throws SQLException {
        ps.setString(1, "v" + x);
        ps.setInt(2, x);
        try (ResultSet rs = ps.executeQuery()) {
            eq(3, rs.getMetaData().getColumnCount(), "columns of statement B");
            check(rs.next(), "statement B returned no row");
            eq("v" + x + "-b", rs.getString(1), "statement B text");
            eq(x + 100, rs.getInt(2), "statement B number");
            eq("b", rs.getString(3), "statement B tag");
            check(!rs.next(), "statement B returned more than one row");
            return x + 100;
        }
    }

    static void preparedAcrossTransactions(Db.Mode m) throws Exception {
        resetTable("s2_log", "worker int not null, seq int not null, a int not null, b int not null, primary key (worker, seq)");
        HikariDataSource ds = pool(m, "s2", POOL);
        try {
            // Warm-up: every pooled connection prepares A and B past the threshold,
            // half of them A first and half B first, so the same statement name
            // (S_1, S_2) stands for different SQL on different client connections.
            List<Connection> held = new ArrayList<>();
            String[][] names = new String[POOL][2];
            boolean warmedUp = false;
            try {
                for (int k = 0; k < POOL; k++) {
                    held.add(ds.getConnection());
                }
                final int reps = m.threshold() + 3;
                runWorkers("s2-warmup", POOL, 30_000, k -> {
                    Connection c = held.get(k);
                    c.setAutoCommit(false);
                    for (int pass = 0; pass < 2; pass++) {
                        boolean doA = (pass == 0) == (k % 2 == 0);
                        for (int r = 0; r < reps; r++) {
                            try (PreparedStatement ps = c.prepareStatement(doA ? SQL_A : SQL_B)) {
                                if (doA) {
                                    runA(ps, k * 1000 + r);
                                } else {
                                    runB(ps, k * 1000 + r);
                                }
                                c.commit(); // one transaction per execution
                                if (r == reps - 1) {
                                    names[k][doA ? 0 : 1] = requireNamed(ps, doA ? "A" : "B");
                                }
                            } catch (Exception e) {
                                abandon(c);
                                throw e;
                            }
                        }
                    }
                    c.setAutoCommit(true);
                });
                warmedUp = true;
            } finally {
                if (!warmedUp) {
                    held.forEach(Db::abandon); // also unblocks warm-up threads still waiting
                }
                held.forEach(Db::closeQuietly); // back to the pool
            }
            boolean collide = false;
            for (int k = 0; k < POOL; k += 2) {
                for (int j = 1; j < POOL; j += 2) {
                    collide |= names[k][0].equals(names[j][1]);
                }
            }
            check(collide, "precondition: expected the same statement name for A and B on different connections, got "
                    + java.util.Arrays.deepToString(names));

            // Many workers, each transaction on whichever pooled connection (and
            // so whichever server connection behind sluice); plus holders that
            // keep one connection and the same PreparedStatement objects for
            // all their transactions.
            final int pooledWorkers = 24;
            final int holders = 4;
            final int pooledIterations = 120;
            final int holderIterations = 150;
            runWorkers("s2", pooledWorkers + holders, 50_000, w -> {
                ThreadLocalRandom rnd = ThreadLocalRandom.current();
                if (w < pooledWorkers) {
                    for (int i = 0; i < pooledIterations; i++) {
                        int x = rnd.nextInt(-100_000, 100_000);
                        boolean txn = i % 4 != 3;
                        try (Connection c = ds.getConnection()) {
                            c.setAutoCommit(!txn);
                            try (PreparedStatement a = c.prepareStatement(SQL_A);
                                    PreparedStatement b = c.prepareStatement(SQL_B);
                                    PreparedStatement ins = c.prepareStatement(SQL_C)) {
                                int ra = runA(a, x);
                                int rb = runB(b, x);
                                requireNamed(a, "A on a warmed-up connection");
                                requireNamed(b, "B on a warmed-up connection");
                                ins.setInt(1, w);
                                ins.setInt(2, i);
                                ins.setInt(3, ra);
                                ins.setInt(4, rb);
                                eq(1, ins.executeUpdate(), "insert row count");
                                if (txn) {
                                    c.commit();
                                }
                            } catch (Exception e) {
                                abandon(c);
                                throw e;
                            }
                            c.setAutoCommit(true);
                        }
                    }
                } else {
                    try (Connection c = connect(m);
                            PreparedStatement a = c.prepareStatement(SQL_A);
                            PreparedStatement b = c.prepareStatement(SQL_B);
                            PreparedStatement ins = c.prepareStatement(SQL_C)) {
                        for (int i = 0; i < holderIterations; i++) {
                            int x = rnd.nextInt(-100_000, 100_000);
                            boolean txn = i % 5 != 4;
                            c.setAutoCommit(!txn);
                            try {
                                // B before A on odd holders: different names again
                                int rb = (w % 2 == 1) ? runB(b, x) : 0;
                                int ra = runA(a, x);
                                if (w % 2 == 0) {
                                    rb = runB(b, x);
                                }
                                ins.setInt(1, w);
                                ins.setInt(2, i);
                                ins.setInt(3, ra);
                                ins.setInt(4, rb);
                                eq(1, ins.executeUpdate(), "insert row count");
                                if (txn) {
                                    c.commit();
                                }
                            } catch (Exception e) {
                                abandon(c);
                                throw e;
                            }
                            if (i >= m.threshold()) {
                                requireNamed(a, "A held across transactions");
                                requireNamed(b, "B held across transactions");
                                requireNamed(ins, "the insert held across transactions");
                            }
                        }
                    }
                }
            });
            long expected = (long) pooledWorkers * pooledIterations + (long) holders * holderIterations;
            eq(expected, adminLong("select count(*) from java_compat.s2_log"), "rows committed");
            eq(0L, adminLong("select count(*) from java_compat.s2_log where b - 100 <> a / 2"), "rows with mismatched A/B results");
        } finally {
            closeQuietly(ds);
        }
    }

    // ------------------------------------------------------------------
    // 3. Transactions rolled back and retried
    // ------------------------------------------------------------------

    static void rollbackAndRetry(Db.Mode m) throws Exception {
        resetTable("s3_rows", "id int primary key, worker int not null, val int not null");
        final int workers = 20;
        final int iterations = 25;
        String insertSql = "insert into java_compat.s3_rows (id, worker, val) values (?, ?, ?)";
        String countSql = "select count(*) from java_compat.s3_rows where id = ?";
        HikariDataSource ds = pool(m, "s3", POOL);
        try {
            runWorkers("s3", workers, 40_000, w -> {
                for (int i = 0; i < iterations; i++) {
                    int id = w * 100_000 + i * 10;
                    try (Connection c = ds.getConnection();
                            PreparedStatement ins = c.prepareStatement(insertSql);
                            PreparedStatement cnt = c.prepareStatement(countSql)) {
                        SqlInsert insert = (rowId, val) -> {
                            ins.setInt(1, rowId);
                            ins.setInt(2, w);
                            ins.setInt(3, val);
                            eq(1, ins.executeUpdate(), "insert row count");
                        };
                        SqlCount count = rowId -> {
                            cnt.setInt(1, rowId);
                            return psLong(cnt);
                        };
                        c.setAutoCommit(false);
                        try {
                            // a) unique violation: roll back, the first insert is gone, retry
                            insert.run(id, 1);
                            expectError("23505", "duplicate key insert", () -> insert.run(id, 2));
                            if (i == 0) {
                                expectError("25P02", "statement in an aborted transaction",
                                        () -> queryLong(c, "select 1"));
                            }
                            c.rollback();
                            eq(0L, count.of(id), "rolled-back insert of id " + id + " visible");
                            c.commit();
                            insert.run(id, 3);
                            c.commit();
                            eq(1L, count.of(id), "retried insert of id " + id);
                            c.commit();

                            // b) explicit error (division by zero), rollback, retry
                            insert.run(id + 1, 1);
                            expectError("22012", "select 1/0", () -> queryLong(c, "select 1/0"));
                            c.rollback();
                            eq(0L, count.of(id + 1), "rolled-back insert of id " + (id + 1) + " visible");
                            insert.run(id + 1, 3);
                            c.commit();

                            // c) savepoint: only the failed part is undone
                            insert.run(id + 2, 3);
                            Savepoint sp = c.setSavepoint();
                            expectError("23505", "duplicate key insert after a savepoint", () -> insert.run(id + 2, 4));
                            c.rollback(sp);
                            insert.run(id + 3, 3);
                            c.commit();

                            // d) plain rollback without an error
                            insert.run(id + 4, 1);
                            c.rollback();
                        } catch (Exception e) {
                            abandon(c);
                            throw e;
                        }
                        c.setAutoCommit(true);
                        eq(0L, count.of(id + 4), "rolled-back insert of id " + (id + 4) + " visible");
                        eq(1L, count.of(id + 3), "insert after rollback to savepoint");
                        eq(1L, queryLong(c, "select 1"), "select 1 after the rollbacks");
                    }
                }
            });
        } finally {
            closeQuietly(ds);
        }
        eq((long) workers * iterations * 4, adminLong("select count(*) from java_compat.s3_rows"), "rows committed");
        eq(0L, adminLong("select count(*) from java_compat.s3_rows where val <> 3 or id % 10 > 3"),
                "rows from rolled-back transactions");
    }

    interface SqlInsert {
        void run(int id, int val) throws SQLException;
    }

    interface SqlCount {
        long of(int id) throws SQLException;
    }

    // ------------------------------------------------------------------
    // 4. SET / search_path
    // ------------------------------------------------------------------

    static void sessionSettings(Db.Mode m) throws Exception {
        final int workers = 12;
        final int iterations = 40;
        List<String> setup = new ArrayList<>();
        for (int w = 0; w < workers; w++) {
            String s = "java_s4_w" + w;
            setup.add("drop schema if exists " + s + " cascade");
            setup.add("create schema " + s);
            setup.add("create table " + s + ".marker (w int not null)");
            setup.add("insert into " + s + ".marker values (" + w + ")");
            setup.add("create table " + s + ".items (n int not null)");
        }
        adminExec(setup.toArray(new String[0]));
        HikariDataSource ds = pool(m, "s4", POOL);
        try {
            // Each worker keeps its pooled connection for the whole scenario;
            // its transactions still land on any of sluice's server connections.
            runWorkers("s4", workers, 40_000, w -> {
                try (Connection c = ds.getConnection()) {
                    try {
                        settingsWorker(c, w, iterations);
                    } catch (Exception e) {
                        abandon(c);
                        throw e;
                    }
                }
            });
        } finally {
            closeQuietly(ds);
        }
        for (int w = 0; w < workers; w++) {
            eq((long) iterations, adminLong("select count(*) from java_s4_w" + w + ".items"),
                    "rows in java_s4_w" + w + ".items");
        }
    }

    /** One scenario-4 worker on its own connection: its settings must follow it across transactions. */
    private static void settingsWorker(Connection c, int w, int iterations) throws Exception {
        String schema = "java_s4_w" + w;
        String app = "java_s4_app" + w;
        String timeout = (10 + w) + "s";
        exec(c, "SET search_path TO " + schema);
        exec(c, "SET application_name TO '" + app + "'");
        exec(c, "SET statement_timeout TO '" + timeout + "'");
        for (int i = 0; i < iterations; i++) {
            boolean txn = i % 2 == 1;
            c.setAutoCommit(!txn);
            eq(schema, queryString(c, "SHOW search_path"), "search_path (iteration " + i + ")");
            eq((long) w, queryLong(c, "select w from marker"), "unqualified marker table (iteration " + i + ")");
            exec(c, "insert into items values (" + i + ")");
            eq(app, queryString(c, "select current_setting('application_name')"), "application_name (iteration " + i + ")");
            eq(timeout, queryString(c, "SHOW statement_timeout"), "statement_timeout (iteration " + i + ")");
            if (txn) {
                c.commit();
            }
            c.setAutoCommit(true);

            if (i == 10) {
                // SET LOCAL lasts only until the end of its transaction
                c.setAutoCommit(false);
                exec(c, "SET LOCAL search_path TO public");
                exec(c, "SET LOCAL statement_timeout TO '1min'");
                eq("public", queryString(c, "SHOW search_path"), "search_path after SET LOCAL");
                eq("1min", queryString(c, "SHOW statement_timeout"), "statement_timeout after SET LOCAL");
                c.commit();
                c.setAutoCommit(true);
                eq(schema, queryString(c, "SHOW search_path"), "search_path after a SET LOCAL transaction");
                eq(timeout, queryString(c, "SHOW statement_timeout"), "statement_timeout after a SET LOCAL transaction");
            } else if (i == 20) {
                // SET in a rolled-back transaction is undone
                c.setAutoCommit(false);
                exec(c, "SET search_path TO public");
                exec(c, "SET application_name TO 'java_s4_rolled_back'");
                eq("public", queryString(c, "SHOW search_path"), "search_path inside the transaction");
                c.rollback();
                c.setAutoCommit(true);
                eq(schema, queryString(c, "SHOW search_path"), "search_path after a rolled-back SET");
                eq(app, queryString(c, "select current_setting('application_name')"),
                        "application_name after a rolled-back SET");
            } else if (i == 30) {
                // SET (not LOCAL) in a committed transaction stays
                app = app + "_v2";
                c.setAutoCommit(false);
                exec(c, "SET application_name TO '" + app + "'");
                c.commit();
                c.setAutoCommit(true);
            }
        }
    }

    // ------------------------------------------------------------------
    // 5. LISTEN/NOTIFY
    // ------------------------------------------------------------------

    static void listenNotify(Db.Mode m) throws Exception {
        final String chan = "java_chan";
        final String chan2 = "java_chan2";
        final int notifiers = 8;
        final int perNotifier = 25;
        Connection listener = connect(m);
        HikariDataSource ds = pool(m, "s5", 8);
        try {
            exec(listener, "LISTEN " + chan);
            exec(listener, "LISTEN " + chan2);
            PGConnection pg = listener.unwrap(PGConnection.class);

            AtomicReference<Throwable> notifyError = new AtomicReference<>();
            Thread notifyThread = new Thread(() -> {
                try {
                    runWorkers("s5-notify", notifiers, 30_000, w -> {
                        for (int i = 0; i < perNotifier; i++) {
                            try (Connection c = ds.getConnection()) {
                                try {
                                    notifyOnce(c, chan, "w" + w + "-" + i, i);
                                } catch (Exception e) {
                                    abandon(c);
                                    throw e;
                                }
                            }
                        }
                    });
                } catch (Throwable t) {
                    notifyError.set(t);
                }
            }, "compat-s5-notifiers");
            notifyThread.setDaemon(true);
            notifyThread.start();

            Map<String, Integer> got = new HashMap<>();
            List<String> unexpected = new ArrayList<>();
            final int expected = notifiers * perNotifier;
            long deadline = System.currentTimeMillis() + 25_000;
            int listenerTxns = 0;
            while (System.currentTimeMillis() < deadline) {
                collect(pg.getNotifications(200), chan, got, unexpected);
                // the listening connection keeps running its own transactions
                listener.setAutoCommit(false);
                eq(42L, queryLong(listener, "select 42"), "listener's own transaction");
                listener.commit();
                listener.setAutoCommit(true);
                listenerTxns++;
                if (!notifyThread.isAlive() && got.size() >= expected) {
                    break;
                }
            }
            notifyThread.join(5_000);
            check(!notifyThread.isAlive(), "notifiers still running");
            if (notifyError.get() != null) {
                throw new Db.Failure("sending notifications failed: " + describe(notifyError.get()));
            }
            // anything late (duplicates, rolled-back payloads) shows up here
            long quiet = System.currentTimeMillis() + 1_000;
            while (System.currentTimeMillis() < quiet) {
                collect(pg.getNotifications(200), chan, got, unexpected);
            }
            List<String> missing = new ArrayList<>();
            List<String> duplicated = new ArrayList<>();
            for (int w = 0; w < notifiers; w++) {
                for (int i = 0; i < perNotifier; i++) {
                    String p = "w" + w + "-" + i;
                    int n = got.getOrDefault(p, 0);
                    if (n == 0) {
                        missing.add(p);
                    } else if (n > 1) {
                        duplicated.add(p + " x" + n);
                    }
                }
            }
            check(missing.isEmpty() && duplicated.isEmpty() && unexpected.isEmpty(),
                    "LISTEN " + chan + " (while running " + listenerTxns + " transactions): received "
                            + got.size() + "/" + expected + " payloads; missing " + abbreviate(missing)
                            + "; duplicated " + abbreviate(duplicated) + "; unexpected " + abbreviate(unexpected));

            // After UNLISTEN nothing more arrives on that channel; chan2 proves the listener still listens.
            exec(listener, "UNLISTEN " + chan);
            try (Connection c = ds.getConnection()) {
                for (int i = 0; i < 5; i++) {
                    notifyPs(c, chan, "after-unlisten-" + i);
                }
                exec(c, "NOTIFY " + chan2 + ", 'marker'");
            }
            List<String> after = new ArrayList<>();
            boolean marker = false;
            long end = System.currentTimeMillis() + 5_000;
            long quietUntil = Long.MAX_VALUE;
            while (System.currentTimeMillis() < Math.min(end, quietUntil)) {
                PGNotification[] ns = pg.getNotifications(200);
                if (ns != null) {
                    for (PGNotification n : ns) {
                        if (n.getName().equals(chan2) && n.getParameter().equals("marker") && !marker) {
                            marker = true;
                            quietUntil = System.currentTimeMillis() + 500;
                        } else {
                            after.add(n.getName() + ":" + n.getParameter());
                        }
                    }
                }
            }
            check(marker, "no notification on " + chan2 + " (still listened) after UNLISTEN " + chan);
            check(after.isEmpty(), "received after UNLISTEN " + chan + ": " + abbreviate(after));
        } finally {
            closeQuietly(listener);
            closeQuietly(ds);
        }
    }

    /** Notification {@code i} of a notifier: committed in one of three ways, and sometimes one rolled back. */
    private static void notifyOnce(Connection c, String chan, String payload, int i) throws SQLException {
        switch (i % 3) {
            case 0 -> {
                c.setAutoCommit(false);
                exec(c, "NOTIFY " + chan + ", '" + payload + "'");
                c.commit();
            }
            case 1 -> {
                c.setAutoCommit(false);
                notifyPs(c, chan, payload);
                c.commit();
            }
            default -> notifyPs(c, chan, payload); // autocommit
        }
        if (i % 5 == 0) {
            c.setAutoCommit(false);
            exec(c, "NOTIFY " + chan + ", 'rb-" + payload + "'");
            notifyPs(c, chan, "rb2-" + payload);
            c.rollback();
        }
        c.setAutoCommit(true);
    }

    private static void notifyPs(Connection c, String chan, String payload) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement("select pg_notify(?, ?)")) {
            ps.setString(1, chan);
            ps.setString(2, payload);
            try (ResultSet rs = ps.executeQuery()) {
                check(rs.next(), "pg_notify returned no row");
            }
        }
    }

    private static void collect(PGNotification[] ns, String chan, Map<String, Integer> got, List<String> unexpected) {
        if (ns == null) {
            return;
        }
        for (PGNotification n : ns) {
            if (!n.getName().equals(chan) || !n.getParameter().matches("w\\d+-\\d+")) {
                unexpected.add(n.getName() + ":" + n.getParameter());
            } else {
                got.merge(n.getParameter(), 1, Integer::sum);
            }
        }
    }

    private static String abbreviate(List<String> items) {
        if (items.isEmpty()) {
            return "none";
        }
        if (items.size() <= 6) {
            return items.toString();
        }
        return items.subList(0, 6) + " … (" + items.size() + " in all)";
    }

    // ------------------------------------------------------------------
    // 6. COPY
    // ------------------------------------------------------------------

    /** Row {@code id} in COPY text format; some notes need escaping, some are NULL. */
    private static String copyRow(int id) {
        String note;
        if (id % 7 == 0) {
            note = "\\N";
        } else if (id % 50 == 1) {
            note = "tab\\there";
        } else if (id % 50 == 2) {
            note = "line\\nbreak";
        } else if (id % 50 == 3) {
            note = "back\\\\slash";
        } else if (id % 50 == 4) {
            note = "ünïcødé ✓ 日本";
        } else {
            note = "note " + id;
        }
        return id + "\tname-" + id + "\t" + note + "\n";
    }

    /** The note of row {@code id} as stored. */
    private static String copyNote(int id) {
        if (id % 7 == 0) {
            return null;
        } else if (id % 50 == 1) {
            return "tab\there";
        } else if (id % 50 == 2) {
            return "line\nbreak";
        } else if (id % 50 == 3) {
            return "back\\slash";
        } else if (id % 50 == 4) {
            return "ünïcødé ✓ 日本";
        }
        return "note " + id;
    }

    private static String copyRows(int from, int to) {
        StringBuilder sb = new StringBuilder();
        for (int id = from; id <= to; id++) {
            sb.append(copyRow(id));
        }
        return sb.toString();
    }

    static void copy(Db.Mode m) throws Exception {
        resetTable("s6_copy", "id int primary key, name text not null, note text");
        resetTable("s6_par", "worker int not null, n int not null, label text not null");
        final int rows = 5000;
        String data = copyRows(1, rows);
        HikariDataSource ds = pool(m, "s6", 4);
        try {
            try (Connection c = ds.getConnection()) {
                try {
                    copyOneConnection(c, rows, data);
                } catch (Exception e) {
                    abandon(c);
                    throw e;
                }
            }

            // several connections copying at once, CSV, one in two inside a transaction
            final int copiers = 4;
            final int perCopier = 1500;
            runWorkers("s6", copiers, 30_000, w -> {
                StringBuilder sb = new StringBuilder();
                for (int n = 0; n < perCopier; n++) {
                    sb.append(w).append(',').append(n).append(",\"label, \"\"").append(w).append('/').append(n).append("\"\"\"\n");
                }
                try (Connection c = ds.getConnection()) {
                    try {
                        CopyManager cm = c.unwrap(PGConnection.class).getCopyAPI();
                        boolean txn = w % 2 == 1;
                        if (txn) {
                            exec(c, "BEGIN");
                        }
                        eq((long) perCopier, cm.copyIn("COPY java_compat.s6_par (worker, n, label) FROM STDIN (FORMAT csv)",
                                new StringReader(sb.toString())), "rows reported by concurrent COPY");
                        if (txn) {
                            exec(c, "COMMIT");
                        }
                        StringWriter out = new StringWriter();
                        eq((long) perCopier, cm.copyOut("COPY (select worker, n, label from java_compat.s6_par where worker = "
                                + w + " order by n) TO STDOUT (FORMAT csv)", out), "rows reported by concurrent COPY out");
                        check(sb.toString().equals(out.toString()), "worker " + w + ": COPY out differs from COPY in");
                    } catch (Exception e) {
                        abandon(c);
                        throw e;
                    }
                }
            });
            eq((long) copiers * perCopier, adminLong("select count(*) from java_compat.s6_par"), "rows from concurrent COPYs");
        } finally {
            closeQuietly(ds);
        }
    }

    /*
     * Scenarios 6 and 7 open their transactions with SQL BEGIN/COMMIT/ROLLBACK
     * in autocommit mode rather than setAutoCommit(false)/commit()/rollback():
     * pgjdbc always runs the COMMIT and ROLLBACK of Connection.commit() and
     * rollback() as named server-side statements (S_1, S_2, …, whatever the
     * prepareThreshold), which scenarios 1-3, 5 and 8 cover. This way COPY and
     * cancellation are tested on their own, and each statement here runs fewer
     * than 5 times per connection, so with the default prepareThreshold no
     * named statement is involved at all.
     */

    private static void copyOneConnection(Connection c, int rows, String data) throws Exception {
        final String copyIn = "COPY java_compat.s6_copy (id, name, note) FROM STDIN";
        CopyManager cm = c.unwrap(PGConnection.class).getCopyAPI();
        eq((long) rows, cm.copyIn(copyIn, new StringReader(data)), "rows reported by COPY FROM STDIN");
        eq((long) rows, queryLong(c, "select count(*) from java_compat.s6_copy"), "rows after COPY FROM STDIN");
        eq((long) rows * (rows + 1) / 2, queryLong(c, "select sum(id) from java_compat.s6_copy"), "sum of ids");
        int[] ids = {1, 2, 3, 4, 7, 49, 50, 51, 52, 53, 54, rows};
        try (PreparedStatement ps = c.prepareStatement(
                "select id, name, note from java_compat.s6_copy where id = any(?) order by id")) {
            ps.setArray(1, c.createArrayOf("int4", java.util.Arrays.stream(ids).boxed().toArray()));
            try (ResultSet rs = ps.executeQuery()) {
                for (int id : ids) {
                    check(rs.next(), "row " + id + " missing after COPY");
                    eq(id, rs.getInt(1), "id");
                    eq("name-" + id, rs.getString(2), "name of row " + id);
                    eq(copyNote(id), rs.getString(3), "note of row " + id);
                }
            }
        }

        // COPY TO STDOUT gives back exactly what went in
        StringWriter out = new StringWriter();
        eq((long) rows, cm.copyOut("COPY (select id, name, note from java_compat.s6_copy order by id) TO STDOUT", out),
                "rows reported by COPY TO STDOUT");
        check(data.equals(out.toString()), "COPY TO STDOUT differs from the data copied in (" + out.getBuffer().length()
                + " vs " + data.length() + " characters)");
        StringWriter csv = new StringWriter();
        eq((long) rows, cm.copyOut("COPY java_compat.s6_copy (id, name) TO STDOUT (FORMAT csv, HEADER)", csv),
                "rows reported by COPY TO STDOUT csv");
        String[] lines = csv.toString().split("\n");
        eq(rows + 1, lines.length, "csv lines");
        eq("id,name", lines[0], "csv header");

        // binary COPY TO STDOUT: the signature and 5000 tuples
        ByteArrayOutputStream bin = new ByteArrayOutputStream();
        eq((long) rows, cm.copyOut("COPY java_compat.s6_copy (id) TO STDOUT (FORMAT binary)", bin), "binary COPY rows");
        byte[] b = bin.toByteArray();
        eq("PGCOPY\n", new String(b, 0, Math.min(7, b.length), StandardCharsets.ISO_8859_1), "binary COPY signature");
        // header 19 bytes, per row 2 (field count) + 4 (length) + 4 (int4), trailer 2
        eq(19 + rows * 10 + 2, b.length, "binary COPY size");

        // COPY in a rolled-back transaction leaves nothing behind
        exec(c, "BEGIN");
        eq(1000L, cm.copyIn(copyIn, new StringReader(copyRows(100_001, 101_000))), "rows copied before rollback");
        eq((long) rows + 1000, queryLong(c, "select count(*) from java_compat.s6_copy"), "rows inside the transaction");
        exec(c, "ROLLBACK");
        eq((long) rows, queryLong(c, "select count(*) from java_compat.s6_copy"), "rows after rolled-back COPY");

        // A COPY failing half-way: error, nothing copied, connection fine
        String bad = copyRows(200_001, 200_500) + "not-a-number\tx\ty\n" + copyRows(200_501, 201_000);
        expectError("22P02", "COPY with a bad row", () -> cm.copyIn(copyIn, new StringReader(bad)));
        eq((long) rows, queryLong(c, "select count(*) from java_compat.s6_copy"), "rows after failed COPY");
        eq(1L, queryLong(c, "select 1"), "select 1 after failed COPY");
    }

    // ------------------------------------------------------------------
    // 7. Cancellation
    // ------------------------------------------------------------------

    interface SqlCall {
        Object call() throws Exception;
    }

    private static final ExecutorService CANCEL_RUNNER = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "compat-s7-query");
        t.setDaemon(true);
        return t;
    });

    /**
     * Runs {@code query} (a 30 s sleep) on another thread, cancels it after
     * a second with {@code cancel}, and expects SQLSTATE 57014 within 5 s.
     */
    private static void expectCancelled(String what, Connection c, SqlCall query, Db.SqlAction cancel) throws Exception {
        Future<Object> f = CANCEL_RUNNER.submit(query::call);
        sleep(1_000);
        if (f.isDone()) {
            throw new Db.Failure(what + ": the query ended before it was cancelled: " + outcome(f));
        }
        long t0 = System.nanoTime();
        cancel.run();
        try {
            Object r = f.get(15, TimeUnit.SECONDS);
            throw new Db.Failure(what + ": the query was not cancelled, it returned " + r);
        } catch (ExecutionException e) {
            if (!(e.getCause() instanceof SQLException s)) {
                throw new Db.Failure(what + ": unexpected " + describe(e.getCause()));
            }
            Db.expectState(s, "57014", what);
        } catch (TimeoutException e) {
            c.unwrap(Connection.class).abort(Runnable::run);
            throw new Db.Failure(what + ": pg_sleep(30) still running 15 s after the cancel request");
        }
        double secs = (System.nanoTime() - t0) / 1e9;
        check(secs < 5, what + ": took " + secs + " s to end after the cancel request");
    }

    private static String outcome(Future<Object> f) {
        try {
            return String.valueOf(f.get());
        } catch (ExecutionException e) {
            return describe(e.getCause());
        } catch (InterruptedException e) {
            return "interrupted";
        }
    }

    static void cancellation(Db.Mode m) throws Exception {
        HikariDataSource ds = pool(m, "s7", 4);
        try (Connection c = ds.getConnection(); Connection other = ds.getConnection()) {
            try {
                cancellationOn(c, other);
            } catch (Exception e) {
                abandon(c);
                abandon(other);
                throw e;
            }
        } finally {
            closeQuietly(ds);
        }
    }

    private static void cancellationOn(Connection c, Connection other) throws Exception {
        // a) Statement.cancel() from another thread, autocommit
        try (Statement st = c.createStatement()) {
            expectCancelled("Statement.cancel()", c, () -> queryOn(st, "select pg_sleep(30)"), st::cancel);
            eq(1L, queryLong(c, "select 1"), "same connection after the cancel");
        }

        // b) a PreparedStatement in an explicit transaction (SQL BEGIN/ROLLBACK: see scenario 6)
        exec(c, "BEGIN");
        try (PreparedStatement ps = c.prepareStatement("select pg_sleep(?)")) {
            ps.setDouble(1, 30);
            expectCancelled("PreparedStatement.cancel() in a transaction", c, () -> {
                try (ResultSet rs = ps.executeQuery()) {
                    return rs.next();
                }
            }, ps::cancel);
        }
        expectError("25P02", "statement after the cancelled one in the same transaction", () -> queryLong(c, "select 1"));
        exec(c, "ROLLBACK");
        eq(2L, queryLong(c, "select 2"), "same connection after rollback");

        // c) only the cancelled connection's query is cancelled
        try (Statement st = c.createStatement(); Statement st2 = other.createStatement()) {
            Future<Object> otherQuery = CANCEL_RUNNER.submit(() -> queryOn(st2, "select 'other:' || pg_sleep(3)"));
            expectCancelled("cancel next to another connection's query", c,
                    () -> queryOn(st, "select pg_sleep(30)"), st::cancel);
            try {
                eq("other:", otherQuery.get(10, TimeUnit.SECONDS), "other connection's query");
            } catch (ExecutionException e) {
                throw new Db.Failure("the other connection's pg_sleep(3) failed: " + describe(e.getCause()));
            } catch (TimeoutException e) {
                throw new Db.Failure("the other connection's pg_sleep(3) did not end");
            }
            eq(3L, queryLong(other, "select 3"), "other connection afterwards");
        }

        // d) Statement.setQueryTimeout (pgjdbc cancels through the same path)
        try (Statement st = c.createStatement()) {
            st.setQueryTimeout(1);
            long t0 = System.nanoTime();
            Future<Object> f = CANCEL_RUNNER.submit(() -> queryOn(st, "select pg_sleep(30)"));
            try {
                f.get(15, TimeUnit.SECONDS);
                throw new Db.Failure("setQueryTimeout(1): pg_sleep(30) was not cancelled");
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof SQLException s)) {
                    throw new Db.Failure("setQueryTimeout(1): unexpected " + describe(e.getCause()));
                }
                Db.expectState(s, "57014", "setQueryTimeout(1)");
            } catch (TimeoutException e) {
                c.unwrap(Connection.class).abort(Runnable::run);
                throw new Db.Failure("setQueryTimeout(1): pg_sleep(30) still running after 15 s");
            }
            double secs = (System.nanoTime() - t0) / 1e9;
            check(secs < 6, "setQueryTimeout(1): took " + secs + " s");
        }
        eq(4L, queryLong(c, "select 4"), "same connection after the query timeout");
    }

    private static String queryOn(Statement st, String sql) throws SQLException {
        try (ResultSet rs = st.executeQuery(sql)) {
            check(rs.next(), "no row from " + sql);
            return rs.getString(1);
        }
    }

    // ------------------------------------------------------------------
    // 8. Server restarted under load
    // ------------------------------------------------------------------

    static final class LoadWorker {
        final int id;
        final boolean pooled;
        volatile long lastNamedOk; // when a transaction last completed with named statements
        final AtomicInteger ok = new AtomicInteger();
        final AtomicInteger errors = new AtomicInteger();
        volatile String lastError = "none";
        volatile int reconnects;
        final java.util.concurrent.ConcurrentHashMap<String, Integer> errorKinds = new java.util.concurrent.ConcurrentHashMap<>();
        /** Times of transactions completed with named statements (milliseconds), for the report. */
        final java.util.concurrent.ConcurrentLinkedQueue<Long> namedOks = new java.util.concurrent.ConcurrentLinkedQueue<>();

        void namedOk() {
            long now = System.currentTimeMillis();
            lastNamedOk = now;
            if (namedOks.size() < 100_000) {
                namedOks.add(now);
            }
        }

        void error(Exception e) {
            errors.incrementAndGet();
            lastError = describe(e);
            errorKinds.merge((pooled ? "[pooled] " : "[own connection] ") + lastError.replaceAll("S_\\d+", "S_n").replaceAll("worker \\d+", "worker n"), 1, Integer::sum);
        }

        long firstNamedOkAfter(long t) {
            return namedOks.stream().filter(x -> x > t).min(Long::compare).orElse(Long.MAX_VALUE);
        }

        LoadWorker(int id, boolean pooled) {
            this.id = id;
            this.pooled = pooled;
        }

        String label() {
            return "worker " + id + (pooled ? " (pooled)" : " (own connection, " + reconnects + " reconnects)");
        }
    }

    /** One transaction: select $1 + 1 and an insert, with results checked; true if both ran as named statements. */
    private static boolean loadTxn(Connection c, PreparedStatement sel, PreparedStatement ins, int worker, int n)
            throws SQLException {
        sel.setInt(1, n);
        eq((long) n + 1, psLong(sel), "select $1::int + 1");
        ins.setInt(1, worker);
        ins.setInt(2, n);
        eq(1, ins.executeUpdate(), "insert row count");
        c.commit();
        return statementName(sel) != null && statementName(ins) != null;
    }

    static void restartUnderLoad(Db.Mode m) throws Exception {
        resetTable("s8_log", "worker int not null, n int not null");
        final String selSql = "select ?::int + 1";
        final String insSql = "insert into java_compat.s8_log (worker, n) values (?, ?)";
        final int pooledWorkers = 16;
        final int ownWorkers = 4;
        HikariDataSource ds = pool(m, "s8", POOL);
        AtomicBoolean stop = new AtomicBoolean();
        List<LoadWorker> workers = new ArrayList<>();
        List<Thread> threads = new ArrayList<>();
        try {
            for (int i = 0; i < pooledWorkers + ownWorkers; i++) {
                LoadWorker lw = new LoadWorker(i, i < pooledWorkers);
                workers.add(lw);
                Thread t = new Thread(() -> {
                    if (lw.pooled) {
                        pooledLoop(ds, lw, stop, selSql, insSql);
                    } else {
                        ownConnectionLoop(m, lw, stop, selSql, insSql);
                    }
                }, "compat-s8-" + i);
                t.setDaemon(true);
                threads.add(t);
            }
            threads.forEach(Thread::start);

            // Every worker has run transactions with named statements before the restart.
            String before = adminString("select pg_postmaster_start_time()::text");
            if (!waitFor(15_000, () -> workers.stream().allMatch(w -> w.lastNamedOk > 0))) {
                throw new Db.Failure("before the restart, workers without a transaction using named statements: "
                        + stuck(workers, 0));
            }
            sleep(500);

            long restartStart = System.currentTimeMillis();
            String restartOutput = restartPostgres();
            long restarted = System.currentTimeMillis();
            String after = null;
            for (int i = 0; i < 50 && after == null; i++) {
                try {
                    after = adminString("select pg_postmaster_start_time()::text");
                } catch (SQLException e) {
                    sleep(200);
                }
            }
            check(after != null && !after.equals(before),
                    "COMPAT_RESTART_CMD did not restart PostgreSQL (start time " + before + " -> " + after + "): " + restartOutput);

            boolean recovered = waitFor(20_000, () -> workers.stream().allMatch(w -> w.lastNamedOk > restarted));
            stop.set(true);
            for (Thread t : threads) {
                t.join(10_000);
            }
            if (!recovered) {
                throw new Db.Failure("within 20 s after the restart, these workers did not complete a transaction "
                        + "with named prepared statements:\n" + stuck(workers, restarted));
            }
            long slowest = 0;
            String slowestLabel = "";
            Map<String, Integer> kinds = new HashMap<>();
            for (LoadWorker w : workers) {
                long took = w.firstNamedOkAfter(restarted) - restarted;
                if (took > slowest) {
                    slowest = took;
                    slowestLabel = w.label();
                }
                w.errorKinds.forEach((k, v) -> kinds.merge(k, v, Integer::sum));
            }
            int reconnects = workers.stream().mapToInt(w -> w.reconnects).sum();
            StringBuilder note = new StringBuilder(String.format(java.util.Locale.ROOT,
                    "restart took %.1f s; slowest recovery %.1f s after it (%s); "
                            + "own-connection workers reconnected %d times; errors:",
                    (restarted - restartStart) / 1000.0, slowest / 1000.0, slowestLabel, reconnects));
            kinds.entrySet().stream().sorted(Map.Entry.<String, Integer>comparingByValue().reversed()).limit(6)
                    .forEach(e -> note.append("\n  ").append(e.getValue()).append(" x ").append(e.getKey()));
            Main.note(note.toString());
            long oks = workers.stream().mapToLong(w -> w.ok.get()).sum();
            long rows = adminLong("select count(*) from java_compat.s8_log");
            check(rows >= oks, "s8_log has " + rows + " rows but " + oks + " commits succeeded");
        } finally {
            stop.set(true);
            closeQuietly(ds);
        }
    }

    private static String stuck(List<LoadWorker> workers, long since) {
        StringBuilder sb = new StringBuilder();
        for (LoadWorker w : workers) {
            if (w.lastNamedOk <= since) {
                if (sb.length() > 0) {
                    sb.append('\n');
                }
                sb.append("  ").append(w.label()).append(": ").append(w.ok.get()).append(" commits, ")
                        .append(w.errors.get()).append(" errors, last error: ").append(w.lastError);
            }
        }
        return sb.toString();
    }

    private static void pooledLoop(HikariDataSource ds, LoadWorker lw, AtomicBoolean stop, String selSql, String insSql) {
        long backoff = 20;
        int n = 0;
        while (!stop.get()) {
            try (Connection c = ds.getConnection()) {
                c.setAutoCommit(false);
                try (PreparedStatement sel = c.prepareStatement(selSql); PreparedStatement ins = c.prepareStatement(insSql)) {
                    boolean named = loadTxn(c, sel, ins, lw.id, n++);
                    lw.ok.incrementAndGet();
                    if (named) {
                        lw.namedOk();
                    }
                } catch (Exception e) {
                    rollbackOrAbandon(c);
                    throw e;
                }
                backoff = 20;
            } catch (Exception e) {
                lw.error(e);
                sleepQuietly(backoff);
                backoff = Math.min(backoff * 2, 500);
                continue;
            }
            sleepQuietly(10);
        }
    }

    /**
     * Keeps one connection and its PreparedStatements for as long as the
     * connection stays open (through sluice it should survive the restart,
     * and so should its named statements); reconnects only if it is closed.
     */
    private static void ownConnectionLoop(Db.Mode m, LoadWorker lw, AtomicBoolean stop, String selSql, String insSql) {
        Connection c = null;
        PreparedStatement sel = null;
        PreparedStatement ins = null;
        long backoff = 20;
        int n = 0;
        boolean first = true;
        while (!stop.get()) {
            try {
                if (c == null) {
                    c = connect(m);
                    c.setAutoCommit(false);
                    sel = c.prepareStatement(selSql);
                    ins = c.prepareStatement(insSql);
                    if (!first) {
                        lw.reconnects++;
                    }
                    first = false;
                }
                boolean named = loadTxn(c, sel, ins, lw.id, n++);
                lw.ok.incrementAndGet();
                if (named) {
                    lw.namedOk();
                }
                backoff = 20;
                sleepQuietly(10);
            } catch (Exception e) {
                lw.error(e);
                rollbackOrAbandon(c);
                try {
                    if (c != null && c.isClosed()) {
                        c = null;
                    }
                } catch (SQLException ignored) {
                    c = null;
                }
                sleepQuietly(backoff);
                backoff = Math.min(backoff * 2, 500);
            }
        }
        closeQuietly(c);
    }

    private static void sleepQuietly(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private static boolean waitFor(long ms, BooleanSupplier cond) {
        long end = System.currentTimeMillis() + ms;
        while (System.currentTimeMillis() < end) {
            if (cond.getAsBoolean()) {
                return true;
            }
            sleep(100);
        }
        return cond.getAsBoolean();
    }

    /** Runs COMPAT_RESTART_CMD (at most 60 s); returns its output. */
    private static String restartPostgres() throws Exception {
        Process p = new ProcessBuilder("sh", "-c", Db.RESTART_CMD).redirectErrorStream(true).start();
        p.getOutputStream().close();
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        Thread reader = new Thread(() -> {
            try (InputStream in = p.getInputStream()) {
                in.transferTo(out);
            } catch (Exception ignored) {
                // process gone
            }
        }, "compat-s8-restart-output");
        reader.setDaemon(true);
        reader.start();
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new Db.Failure("COMPAT_RESTART_CMD did not finish within 60 s");
        }
        reader.join(2_000);
        String text = out.toString(StandardCharsets.UTF_8).trim();
        check(p.exitValue() == 0, "COMPAT_RESTART_CMD exited with " + p.exitValue() + ": " + text);
        return text;
    }
}
