package compat;

import com.zaxxer.hikari.HikariDataSource;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import java.util.stream.Collectors;

/**
 * sluice compatibility suite for pgjdbc + HikariCP: runs every scenario once
 * with pgjdbc's default prepareThreshold (5) and once with prepareThreshold=1,
 * prints PASS/FAIL per scenario and exits non-zero if anything failed.
 *
 * <p>Optional filters for development: {@code COMPAT_JAVA_SCENARIOS=2,5} and
 * {@code COMPAT_JAVA_MODES=default|threshold1}.
 */
public final class Main {
    private Main() {}

    interface Scenario {
        void run(Db.Mode mode) throws Exception;
    }

    record Entry(int number, String name, long timeoutMs, Scenario body) {}

    static final List<Entry> SCENARIOS = List.of(
            new Entry(1, "many concurrent workers", 60_000, Scenarios::concurrentWorkers),
            new Entry(2, "named prepared statements across transactions", 60_000, Scenarios::preparedAcrossTransactions),
            new Entry(3, "rollback and retry", 45_000, Scenarios::rollbackAndRetry),
            new Entry(4, "SET / search_path", 45_000, Scenarios::sessionSettings),
            new Entry(5, "LISTEN/NOTIFY", 45_000, Scenarios::listenNotify),
            new Entry(6, "COPY", 45_000, Scenarios::copy),
            new Entry(7, "cancellation", 60_000, Scenarios::cancellation),
            new Entry(8, "server restarted under load", 90_000, Scenarios::restartUnderLoad));

    static final List<Db.Mode> MODES = List.of(
            new Db.Mode("default", null, 5),
            new Db.Mode("threshold1", "1", 1));

    /** Past this, remaining scenarios are reported as not run (the suite must stay well under the runner's limits). */
    static final long BUDGET_MS = 170_000;

    public static void main(String[] args) {
        long start = System.currentTimeMillis();
        Set<String> onlyScenarios = filter("COMPAT_JAVA_SCENARIOS");
        Set<String> onlyModes = filter("COMPAT_JAVA_MODES");
        System.out.printf("compat/java: pgjdbc %s, HikariCP %s, target %s:%s (direct PostgreSQL on %s)%n",
                org.postgresql.util.DriverInfo.DRIVER_VERSION,
                hikariVersion(),
                Db.HOST, Db.PORT, Db.DIRECT_PORT);

        List<String> failures = new ArrayList<>();
        int passed = 0;
        for (Db.Mode mode : MODES) {
            if (onlyModes != null && !onlyModes.contains(mode.name())) {
                continue;
            }
            String modeLabel = mode.prepareThreshold() == null
                    ? "prepareThreshold=default(5)"
                    : "prepareThreshold=" + mode.prepareThreshold();
            for (Entry e : SCENARIOS) {
                if (onlyScenarios != null && !onlyScenarios.contains(String.valueOf(e.number()))) {
                    continue;
                }
                String label = String.format("[%s] %d %s", modeLabel, e.number(), e.name());
                if (System.currentTimeMillis() - start > BUDGET_MS) {
                    System.out.println("SKIP " + label + ": time budget exhausted");
                    failures.add(label + ": not run, time budget exhausted");
                    continue;
                }
                long t0 = System.nanoTime();
                note = null;
                String error = runWithTimeout(e, mode);
                double secs = (System.nanoTime() - t0) / 1e9;
                if (error == null) {
                    passed++;
                    System.out.printf(Locale.ROOT, "PASS %s (%.1f s)%n", label, secs);
                } else {
                    System.out.printf(Locale.ROOT, "FAIL %s (%.1f s)%n    %s%n", label, secs,
                            error.replace("\n", "\n    "));
                    failures.add(label + ": " + error.lines().findFirst().orElse(""));
                }
                if (note != null) {
                    System.out.println("    " + note.replace("\n", "\n    "));
                }
                System.out.flush();
            }
        }
        System.out.printf(Locale.ROOT, "compat/java: %d passed, %d failed (%.1f s)%n", passed, failures.size(),
                (System.currentTimeMillis() - start) / 1000.0);
        if (!failures.isEmpty()) {
            System.out.println("failed:");
            failures.forEach(f -> System.out.println("  " + f));
        }
        System.out.flush();
        System.exit(failures.isEmpty() ? 0 : 1);
    }

    private static String hikariVersion() {
        try (var in = HikariDataSource.class.getResourceAsStream("/META-INF/maven/com.zaxxer/HikariCP/pom.properties")) {
            java.util.Properties p = new java.util.Properties();
            p.load(in);
            return p.getProperty("version", "?");
        } catch (Exception e) {
            return "?";
        }
    }

    private static Set<String> filter(String var) {
        String v = System.getenv(var);
        if (v == null || v.isBlank()) {
            return null;
        }
        return Arrays.stream(v.split(",")).map(String::trim).collect(Collectors.toSet());
    }

    /** Runs one scenario on its own thread; returns null on success, else what went wrong. */
    private static String runWithTimeout(Entry e, Db.Mode mode) {
        String[] result = {null};
        Thread t = new Thread(() -> {
            try {
                e.body().run(mode);
            } catch (Throwable ex) {
                result[0] = Db.describe(ex);
                if (!(ex instanceof Db.Failure) && !(ex instanceof java.sql.SQLException)) {
                    result[0] += "\n" + topFrames(ex.getStackTrace(), 6);
                }
            }
        }, "compat-scenario-" + e.number());
        t.setDaemon(true);
        t.start();
        try {
            t.join(e.timeoutMs());
        } catch (InterruptedException ex) {
            Thread.currentThread().interrupt();
        }
        if (t.isAlive()) {
            StringBuilder sb = new StringBuilder("timed out after " + e.timeoutMs() / 1000 + " s; stuck threads:");
            for (Thread other : Thread.getAllStackTraces().keySet()) {
                if (other.isAlive() && other.getName().startsWith("compat-")) {
                    sb.append("\n  ").append(other.getName()).append(" at ").append(topFrames(other, 4));
                }
            }
            t.interrupt();
            return sb.toString();
        }
        return result[0];
    }

    private static volatile String note;

    /** Extra information printed under a scenario's result line. */
    static void note(String text) {
        note = text;
    }

    static String topFrames(Thread t, int n) {
        return topFrames(t.getStackTrace(), n);
    }

    static String topFrames(StackTraceElement[] frames, int n) {
        return Arrays.stream(frames).limit(n).map(StackTraceElement::toString)
                .collect(Collectors.joining(" < "));
    }
}
