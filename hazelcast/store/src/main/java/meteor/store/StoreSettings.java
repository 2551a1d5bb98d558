package meteor.store;

import java.util.Properties;

/**
 * Where the stores' database is and how many connections a member opens to it.
 *
 * <p>Each setting is read from the store's own properties in the member configuration ({@code <properties>} of a
 * {@code ringbuffer-store} or {@code map-store}) and, when absent there, from the member's JVM system property of
 * the same name prefixed with {@code meteor.store.}: {@code jdbc-url} / {@code -Dmeteor.store.jdbc-url}, and so on.
 * System properties let one member configuration serve every environment (and keep the password out of the file).
 */
public final class StoreSettings {
    /** The JDBC URL, e.g. {@code jdbc:postgresql://db.example:5432/meteor}. Required. */
    public static final String URL = "jdbc-url";
    /** The database user. Optional (the driver's default). */
    public static final String USER = "jdbc-user";
    /** The database password. Optional. */
    public static final String PASSWORD = "jdbc-password";
    /** Connections one member keeps open to the database at most (default 8). */
    public static final String POOL_SIZE = "pool-size";
    /** How long a store call waits for a free connection before it fails, in milliseconds (default 30000). */
    public static final String ACQUIRE_TIMEOUT_MS = "acquire-timeout-ms";

    static final String SYSTEM_PREFIX = "meteor.store.";
    private static final int MAX_POOL_SIZE = 256;

    final String url;
    final String user;
    final String password;
    final int poolSize;
    final long acquireTimeoutMs;

    private StoreSettings(String url, String user, String password, int poolSize, long acquireTimeoutMs) {
        this.url = url;
        this.user = user;
        this.password = password;
        this.poolSize = poolSize;
        this.acquireTimeoutMs = acquireTimeoutMs;
    }

    /**
     * The settings of one store.
     *
     * @param properties the store's properties from the member configuration (may be null)
     * @throws IllegalArgumentException a setting is missing or not a valid number; the message names it
     */
    public static StoreSettings from(Properties properties) {
        Properties props = properties == null ? new Properties() : properties;
        String url = setting(props, URL);
        if (url == null || url.isBlank()) {
            throw new IllegalArgumentException("meteor store: no JDBC URL; set the store property '" + URL
                    + "' in the member configuration or the system property -D" + SYSTEM_PREFIX + URL
                    + "=jdbc:postgresql://HOST:PORT/DATABASE");
        }
        int poolSize = (int) number(props, POOL_SIZE, 8, 1, MAX_POOL_SIZE);
        long acquireTimeoutMs = number(props, ACQUIRE_TIMEOUT_MS, 30_000, 1, 3_600_000);
        return new StoreSettings(url.trim(), setting(props, USER), setting(props, PASSWORD), poolSize,
                acquireTimeoutMs);
    }

    /** The identity of the database a store talks to: stores with equal keys share one connection pool. */
    String poolKey() {
        return url + "\u0000" + (user == null ? "" : user) + "\u0000" + poolSize + "\u0000" + acquireTimeoutMs;
    }

    private static String setting(Properties props, String name) {
        String value = props.getProperty(name);
        if (value == null || value.contains("${")) {  // an unresolved placeholder counts as not set
            value = System.getProperty(SYSTEM_PREFIX + name);
        }
        return value;
    }

    private static long number(Properties props, String name, long fallback, long min, long max) {
        String text = setting(props, name);
        if (text == null || text.isBlank()) {
            return fallback;
        }
        long value;
        try {
            value = Long.parseLong(text.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("meteor store: '" + name + "' must be an integer, got '" + text
                    + "'", e);
        }
        if (value < min || value > max) {
            throw new IllegalArgumentException("meteor store: '" + name + "' must be between " + min + " and "
                    + max + ", got " + value);
        }
        return value;
    }
}
