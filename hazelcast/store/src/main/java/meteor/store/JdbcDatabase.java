package meteor.store;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.SQLRecoverableException;
import java.sql.SQLTransientConnectionException;
import java.sql.Statement;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;

/**
 * One database as the stores of a member use it: a bounded pool of plain JDBC connections, the tables (created
 * when missing), and one retry on a fresh connection when a connection broke.
 *
 * <p>A member has one store instance per ring (per stream lane) and per map, so the stores share pools: one per
 * {@link StoreSettings#poolKey()}. Hazelcast calls the stores from its partition threads, so {@code pool-size}
 * at least the member's partition thread count keeps those threads from queueing for a connection. Every
 * statement the stores run is idempotent (upserts, deletes, selects), which is what makes the retry safe.
 */
final class JdbcDatabase {
    static final String RING_TABLE = "meteor_ring_items";
    static final String MAP_TABLE = "meteor_map_entries";

    private static final Map<String, JdbcDatabase> SHARED = new ConcurrentHashMap<>();

    /** Work on one connection. */
    interface Work<T> {
        T run(Connection connection, Dialect dialect) throws SQLException;
    }

    private final StoreSettings settings;
    private final Semaphore permits;
    private final Deque<Connection> idle = new ArrayDeque<>();
    private volatile Dialect dialect;

    private JdbcDatabase(StoreSettings settings) {
        this.settings = settings;
        this.permits = new Semaphore(settings.poolSize, true);
    }

    /** The pool for these settings, shared by every store of this member that names the same database. */
    static JdbcDatabase shared(StoreSettings settings) {
        return SHARED.computeIfAbsent(settings.poolKey(), key -> new JdbcDatabase(settings));
    }

    /**
     * Runs {@code work} on a pooled connection (in auto-commit mode; work that needs a transaction opens and ends
     * its own). A connection that fails is closed, never pooled again; when it failed as a connection (SQL state
     * class 08, or the driver says the failure is recoverable) the work runs once more on a new one.
     *
     * @param what what the work does, for the error message
     * @throws StoreException the work failed, or no connection was free within {@code acquire-timeout-ms}
     */
    <T> T run(String what, Work<T> work) {
        acquire(what);
        try {
            for (int attempt = 1; ; attempt++) {
                Connection connection = null;
                try {
                    connection = take();
                    T result = work.run(connection, dialect);
                    give(connection);
                    return result;
                } catch (SQLException e) {
                    discard(connection);
                    if (brokenConnection(e)) {
                        discardIdle();  // the database went away or restarted: the other pooled ones are stale too
                    }
                    if (attempt >= 2 || !brokenConnection(e)) {
                        throw new StoreException("meteor store: " + what + " failed on " + settings.url + ": "
                                + e.getMessage() + " (SQL state " + e.getSQLState() + ")", e);
                    }
                }
            }
        } finally {
            permits.release();
        }
    }

    /**
     * {@link #run} with the work in one database transaction: committed when it returns, rolled back when it fails
     * (a batch of upserts is stored whole or not at all).
     */
    <T> T runInTransaction(String what, Work<T> work) {
        return run(what, (connection, dialect) -> {
            connection.setAutoCommit(false);
            try {
                T result = work.run(connection, dialect);
                connection.commit();
                return result;
            } catch (SQLException | RuntimeException e) {
                try {
                    connection.rollback();
                } catch (SQLException rollback) {
                    e.addSuppressed(rollback);
                }
                throw e;
            } finally {
                connection.setAutoCommit(true);
            }
        });
    }

    private void acquire(String what) {
        try {
            if (!permits.tryAcquire(settings.acquireTimeoutMs, TimeUnit.MILLISECONDS)) {
                throw new StoreException("meteor store: " + what + ": no database connection free after "
                        + settings.acquireTimeoutMs + " ms (all " + settings.poolSize + " busy); raise the store "
                        + "property '" + StoreSettings.POOL_SIZE + "' or check the database at " + settings.url,
                        null);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new StoreException("meteor store: " + what + ": interrupted while waiting for a connection", e);
        }
    }

    private Connection take() throws SQLException {
        synchronized (idle) {
            Connection pooled = idle.pollFirst();
            if (pooled != null) {
                return pooled;
            }
        }
        Connection connection = settings.user == null
                ? DriverManager.getConnection(settings.url)
                : DriverManager.getConnection(settings.url, settings.user,
                        settings.password == null ? "" : settings.password);
        try {
            connection.setAutoCommit(true);
            if (dialect == null) {
                createTables(connection);
            }
        } catch (SQLException | RuntimeException e) {
            discard(connection);
            throw e;
        }
        return connection;
    }

    private void give(Connection connection) {
        synchronized (idle) {
            idle.addFirst(connection);
        }
    }

    private void discardIdle() {
        synchronized (idle) {
            while (!idle.isEmpty()) {
                discard(idle.pollFirst());
            }
        }
    }

    private static void discard(Connection connection) {
        if (connection == null) {
            return;
        }
        try {
            connection.close();
        } catch (SQLException ignored) {
            // the connection is being thrown away because it failed; its close failing says nothing more
        }
    }

    /**
     * Creates the two tables when missing. Members starting together race to create them; a creation that loses
     * the race fails once, and the second try finds the tables.
     */
    private synchronized void createTables(Connection connection) throws SQLException {
        if (dialect != null) {
            return;
        }
        Dialect found = Dialect.of(connection.getMetaData().getDatabaseProductName());
        String[] ddl = {
            "CREATE TABLE IF NOT EXISTS " + RING_TABLE + " ("
                + "ring VARCHAR(512) NOT NULL, "
                + "seq BIGINT NOT NULL, "
                + "item " + found.binary + " NOT NULL, "
                + "PRIMARY KEY (ring, seq))",
            "CREATE TABLE IF NOT EXISTS " + MAP_TABLE + " ("
                + "map_name VARCHAR(512) NOT NULL, "
                + "key_type CHAR(1) NOT NULL, "
                + "key_data " + found.binary + " NOT NULL, "
                + "value_type CHAR(1) NOT NULL, "
                + "value_data " + found.binary + " NOT NULL, "
                + "PRIMARY KEY (map_name, key_type, key_data))",
        };
        for (int attempt = 1; ; attempt++) {
            try (Statement statement = connection.createStatement()) {
                for (String sql : ddl) {
                    statement.execute(sql);
                }
                break;
            } catch (SQLException e) {
                if (attempt >= 2) {
                    throw e;
                }
            }
        }
        dialect = found;
    }

    private static boolean brokenConnection(SQLException e) {
        String state = e.getSQLState();
        return e instanceof SQLRecoverableException || e instanceof SQLTransientConnectionException
                || (state != null && state.startsWith("08"));
    }
}
