package meteor.store;

import com.hazelcast.map.MapLoader;
import com.hazelcast.map.MapStoreFactory;
import java.util.Properties;

/**
 * The {@code factory-class-name} of a map store configuration: one {@link JdbcMapStore} per map, so one
 * configuration with a wildcard name covers several maps.
 */
public final class JdbcMapStoreFactory implements MapStoreFactory<Object, Object> {
    @Override
    public MapLoader<Object, Object> newMapStore(String mapName, Properties properties) {
        return new JdbcMapStore(mapName, StoreSettings.from(properties));
    }
}
