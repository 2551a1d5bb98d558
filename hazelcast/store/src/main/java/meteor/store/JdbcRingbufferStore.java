package meteor.store;

import com.hazelcast.ringbuffer.RingbufferStore;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.List;

/**
 * Keeps every item of one ring (one meteor-spark lane) in the table {@code meteor_ring_items}, keyed by
 * {@code (ring, seq)}.
 *
 * <p>Hazelcast stores an item before it adds it to the ring and before it acknowledges the publish, so an
 * acknowledged item is in the database. It answers reads below the ring's head (overwritten items, or every item
 * after a restart) with {@link #load}, and after a restart continues the ring at {@link #getLargestSequence()} + 1.
 *
 * <p>Items are opaque: with {@code in-memory-format BINARY} Hazelcast hands over each item's serialized form (its
 * 8-byte header, then meteor's ring item) and takes the same bytes back from {@code load}. They are stored as
 * they are. (The type parameter is Object, not byte[]: Hazelcast passes {@code storeAll} an Object[] of byte[]s.)
 */
public final class JdbcRingbufferStore implements RingbufferStore<Object> {
    private static final List<String> KEYS = List.of("ring", "seq");
    private static final List<String> VALUES = List.of("item");

    private final String ring;
    private final JdbcDatabase database;

    /**
     * @param ring the ring's name (e.g. {@code meteor.stream::orders.0})
     * @param settings where the database is
     */
    public JdbcRingbufferStore(String ring, StoreSettings settings) {
        if (ring == null || ring.isEmpty() || ring.length() > 512) {
            throw new IllegalArgumentException("meteor store: a ring name of 1 to 512 characters is needed, got "
                    + (ring == null ? "none" : ring.length() + " characters"));
        }
        this.ring = ring;
        this.database = JdbcDatabase.shared(settings);
    }

    @Override
    public void store(long sequence, Object item) {
        storeAll(sequence, new Object[] {item});
    }

    /** One batched upsert in one transaction: either every item of the publish is stored or none is. */
    @Override
    public void storeAll(long firstSequence, Object[] items) {
        if (items.length == 0) {
            return;
        }
        for (Object item : items) {
            if (!(item instanceof byte[])) {
                throw new IllegalArgumentException("meteor store: ring " + ring + " handed over an item of type "
                        + (item == null ? "null" : item.getClass().getName()) + "; configure the ring with "
                        + "<in-memory-format>BINARY</in-memory-format> so items reach the store as bytes");
            }
        }
        database.runInTransaction("storing " + items.length + " item(s) of ring " + ring + " from sequence "
                + firstSequence, (connection, dialect) -> {
                    try (PreparedStatement upsert = connection.prepareStatement(
                            dialect.upsert(JdbcDatabase.RING_TABLE, KEYS, VALUES))) {
                        for (int i = 0; i < items.length; i++) {
                            upsert.setString(1, ring);
                            upsert.setLong(2, firstSequence + i);
                            upsert.setBytes(3, (byte[]) items[i]);
                            upsert.addBatch();
                        }
                        upsert.executeBatch();
                    }
                    return null;
                });
    }

    /** The item at {@code sequence}, or null when the database does not hold it. */
    @Override
    public Object load(long sequence) {
        return database.run("loading sequence " + sequence + " of ring " + ring, (connection, dialect) -> {
            try (PreparedStatement select = connection.prepareStatement(
                    "SELECT item FROM " + JdbcDatabase.RING_TABLE + " WHERE ring = ? AND seq = ?")) {
                select.setString(1, ring);
                select.setLong(2, sequence);
                try (ResultSet rows = select.executeQuery()) {
                    return rows.next() ? (Object) rows.getBytes(1) : null;
                }
            }
        });
    }

    /** The highest stored sequence, or -1 when the ring has nothing stored (a new ring starts at 0). */
    @Override
    public long getLargestSequence() {
        return database.run("finding the largest sequence of ring " + ring, (connection, dialect) -> {
            try (PreparedStatement select = connection.prepareStatement(
                    "SELECT MAX(seq) FROM " + JdbcDatabase.RING_TABLE + " WHERE ring = ?")) {
                select.setString(1, ring);
                try (ResultSet rows = select.executeQuery()) {
                    rows.next();
                    long largest = rows.getLong(1);
                    return rows.wasNull() ? -1L : largest;
                }
            }
        });
    }
}
