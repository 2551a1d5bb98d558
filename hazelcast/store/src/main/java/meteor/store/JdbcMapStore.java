package meteor.store;

import com.hazelcast.core.HazelcastInstance;
import com.hazelcast.map.MapLoaderLifecycleSupport;
import com.hazelcast.map.MapStore;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;

/**
 * Keeps one map's entries in the table {@code meteor_map_entries}, keyed by {@code (map_name, key_type,
 * key_data)}; keys and values are String or byte[] ({@link Typed}).
 *
 * <p>Configure it write-through ({@code write-delay-seconds 0}): Hazelcast then stores an entry before the put or
 * compare-and-set returns, so a confirmed offset or a committed transaction is in the database once the client has
 * its answer. With {@code initial-mode EAGER} a map is loaded whole ({@link #loadAllKeys()}) when a restarted
 * cluster first creates it, before any operation on it runs.
 *
 * <p>Usable both ways Hazelcast creates a map store: {@code factory-class-name} {@link JdbcMapStoreFactory}, or
 * {@code class-name} of this class (then {@link #init} tells it the map's name).
 */
public final class JdbcMapStore implements MapStore<Object, Object>, MapLoaderLifecycleSupport {
    /** {@code loadAll} asks for at most this many keys per statement. */
    private static final int SELECT_CHUNK = 500;
    private static final List<String> KEYS = List.of("map_name", "key_type", "key_data");
    private static final List<String> VALUES = List.of("value_type", "value_data");

    private String mapName;
    private JdbcDatabase database;

    /** For {@code class-name}: Hazelcast calls {@link #init} before any other method. */
    public JdbcMapStore() {
    }

    /** For {@link JdbcMapStoreFactory}. */
    public JdbcMapStore(String mapName, StoreSettings settings) {
        bind(mapName, settings);
    }

    @Override
    public void init(HazelcastInstance instance, Properties properties, String mapName) {
        if (this.mapName == null) {
            bind(mapName, StoreSettings.from(properties));
        }
    }

    @Override
    public void destroy() {
        // the connection pool is shared with the member's other stores and lives as long as the member
    }

    private void bind(String name, StoreSettings settings) {
        if (name == null || name.isEmpty() || name.length() > 512) {
            throw new IllegalArgumentException("meteor store: a map name of 1 to 512 characters is needed, got "
                    + (name == null ? "none" : name.length() + " characters"));
        }
        this.mapName = name;
        this.database = JdbcDatabase.shared(settings);
    }

    @Override
    public void store(Object key, Object value) {
        storeAll(Map.of(key, value));
    }

    /** One batched upsert in one transaction. */
    @Override
    public void storeAll(Map<Object, Object> entries) {
        if (entries.isEmpty()) {
            return;
        }
        List<Typed[]> rows = new ArrayList<>(entries.size());
        for (Map.Entry<Object, Object> entry : entries.entrySet()) {
            rows.add(new Typed[] {Typed.of(entry.getKey(), "key", mapName), Typed.of(entry.getValue(), "value",
                    mapName)});
        }
        database.runInTransaction("storing " + rows.size() + " entr" + (rows.size() == 1 ? "y" : "ies") + " of map "
                + mapName, (connection, dialect) -> {
                    try (PreparedStatement upsert = connection.prepareStatement(
                            dialect.upsert(JdbcDatabase.MAP_TABLE, KEYS, VALUES))) {
                        for (Typed[] row : rows) {
                            upsert.setString(1, mapName);
                            upsert.setString(2, row[0].type);
                            upsert.setBytes(3, row[0].data);
                            upsert.setString(4, row[1].type);
                            upsert.setBytes(5, row[1].data);
                            upsert.addBatch();
                        }
                        upsert.executeBatch();
                    }
                    return null;
                });
    }

    @Override
    public void delete(Object key) {
        deleteAll(List.of(key));
    }

    @Override
    public void deleteAll(Collection<Object> keys) {
        if (keys.isEmpty()) {
            return;
        }
        List<Typed> typed = new ArrayList<>(keys.size());
        for (Object key : keys) {
            typed.add(Typed.of(key, "key", mapName));
        }
        database.runInTransaction("deleting " + typed.size() + " key(s) of map " + mapName, (connection, dialect) -> {
            try (PreparedStatement delete = connection.prepareStatement("DELETE FROM " + JdbcDatabase.MAP_TABLE
                    + " WHERE map_name = ? AND key_type = ? AND key_data = ?")) {
                for (Typed key : typed) {
                    delete.setString(1, mapName);
                    delete.setString(2, key.type);
                    delete.setBytes(3, key.data);
                    delete.addBatch();
                }
                delete.executeBatch();
            }
            return null;
        });
    }

    @Override
    public Object load(Object key) {
        Typed typed = Typed.of(key, "key", mapName);
        return database.run("loading a key of map " + mapName, (connection, dialect) -> {
            try (PreparedStatement select = connection.prepareStatement("SELECT value_type, value_data FROM "
                    + JdbcDatabase.MAP_TABLE + " WHERE map_name = ? AND key_type = ? AND key_data = ?")) {
                select.setString(1, mapName);
                select.setString(2, typed.type);
                select.setBytes(3, typed.data);
                try (ResultSet rows = select.executeQuery()) {
                    return rows.next() ? Typed.decode(rows.getString(1), rows.getBytes(2), mapName) : null;
                }
            }
        });
    }

    /** The stored entries among {@code keys}, a few hundred keys per statement; absent keys are left out. */
    @Override
    public Map<Object, Object> loadAll(Collection<Object> keys) {
        Map<Object, Object> found = new HashMap<>();
        List<Object> chunk = new ArrayList<>(SELECT_CHUNK);
        for (Object key : keys) {
            chunk.add(key);
            if (chunk.size() == SELECT_CHUNK) {
                loadChunk(chunk, found);
                chunk.clear();
            }
        }
        if (!chunk.isEmpty()) {
            loadChunk(chunk, found);
        }
        return found;
    }

    private void loadChunk(List<Object> keys, Map<Object, Object> found) {
        // byte[] keys have no value equality, so rows are matched back to the caller's key objects by tag+bytes
        Map<String, Object> byText = new HashMap<>();
        StringBuilder sql = new StringBuilder("SELECT key_type, key_data, value_type, value_data FROM "
                + JdbcDatabase.MAP_TABLE + " WHERE map_name = ? AND (");
        List<Typed> typed = new ArrayList<>(keys.size());
        for (Object key : keys) {
            Typed t = Typed.of(key, "key", mapName);
            typed.add(t);
            byText.put(identity(t.type, t.data), key);
            sql.append(typed.size() == 1 ? "" : " OR ").append("(key_type = ? AND key_data = ?)");
        }
        sql.append(')');
        database.run("loading " + keys.size() + " key(s) of map " + mapName, (connection, dialect) -> {
            try (PreparedStatement select = connection.prepareStatement(sql.toString())) {
                select.setString(1, mapName);
                int i = 2;
                for (Typed t : typed) {
                    select.setString(i++, t.type);
                    select.setBytes(i++, t.data);
                }
                try (ResultSet rows = select.executeQuery()) {
                    while (rows.next()) {
                        Object key = byText.get(identity(rows.getString(1), rows.getBytes(2)));
                        if (key != null) {
                            found.put(key, Typed.decode(rows.getString(3), rows.getBytes(4), mapName));
                        }
                    }
                }
            }
            return null;
        });
    }

    /** Every key stored for this map: what a restarted cluster loads. */
    @Override
    public Iterable<Object> loadAllKeys() {
        return database.run("listing the keys of map " + mapName, (connection, dialect) -> {
            List<Object> keys = new ArrayList<>();
            try (PreparedStatement select = connection.prepareStatement("SELECT key_type, key_data FROM "
                    + JdbcDatabase.MAP_TABLE + " WHERE map_name = ?")) {
                select.setString(1, mapName);
                try (ResultSet rows = select.executeQuery()) {
                    while (rows.next()) {
                        keys.add(Typed.decode(rows.getString(1), rows.getBytes(2), mapName));
                    }
                }
            }
            return keys;
        });
    }

    private static String identity(String type, byte[] data) {
        return type + HexFormat.of().formatHex(data);
    }
}
