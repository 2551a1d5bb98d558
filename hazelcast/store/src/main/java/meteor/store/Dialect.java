package meteor.store;

import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.stream.Collectors;

/**
 * The little SQL that differs between the supported databases: the binary column type and the upsert.
 *
 * <p>Every write is an upsert keyed by the table's primary key, so a store call Hazelcast repeats (a retry after a
 * lost connection, an item stored again after a migration) leaves one row.
 */
enum Dialect {
    POSTGRESQL("BYTEA") {
        @Override
        String upsert(String table, List<String> keys, List<String> values) {
            return "INSERT INTO " + table + " (" + columns(keys, values) + ") VALUES (" + marks(keys, values)
                    + ") ON CONFLICT (" + String.join(", ", keys) + ") DO UPDATE SET "
                    + values.stream().map(c -> c + " = EXCLUDED." + c).collect(Collectors.joining(", "));
        }
    },
    H2("VARBINARY") {
        @Override
        String upsert(String table, List<String> keys, List<String> values) {
            return "MERGE INTO " + table + " (" + columns(keys, values) + ") KEY (" + String.join(", ", keys)
                    + ") VALUES (" + marks(keys, values) + ")";
        }
    };

    /** The column type of an opaque byte string. */
    final String binary;

    Dialect(String binary) {
        this.binary = binary;
    }

    /** An upsert of one row: key columns then value columns, one {@code ?} each, in that order. */
    abstract String upsert(String table, List<String> keys, List<String> values);

    /**
     * The dialect of a database, by the product name its JDBC driver reports.
     *
     * @throws IllegalArgumentException any other database; the message names the supported ones
     */
    static Dialect of(String productName) {
        String name = productName == null ? "" : productName.toLowerCase(Locale.ROOT);
        if (name.contains("postgresql")) {
            return POSTGRESQL;
        }
        if (name.equals("h2")) {
            return H2;
        }
        throw new IllegalArgumentException("meteor store: database '" + productName
                + "' is not supported; use PostgreSQL or H2 (jdbc:postgresql://... or jdbc:h2:tcp://...)");
    }

    private static String columns(List<String> keys, List<String> values) {
        return String.join(", ", keys) + ", " + String.join(", ", values);
    }

    private static String marks(List<String> keys, List<String> values) {
        return String.join(", ", Collections.nCopies(keys.size() + values.size(), "?"));
    }
}
