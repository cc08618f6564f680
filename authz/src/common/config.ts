/**
 * One config module: defaults → parse env → validate → freeze. This file is its entry point and
 * only re-exports; each concern lives in config/:
 * - config/types.ts: the Config shape, its parts, allowed values, ConfigError, defaults;
 * - config/parse.ts: the per-setting parsers;
 * - config/load.ts: loadConfig, which assembles and freezes the Config;
 * - config/warnings.ts: configWarnings, settings that load but contradict one another;
 * - config/names.ts: KNOWN_SETTINGS and the unknown-setting check (STRICT_SETTINGS).
 *
 * Every name here is public interface (docs/api.md, README "Settings"). A bad value throws a
 * ConfigError at start-up naming the variable and what was expected; nothing is
 * silently coerced (TIMEOUT=abc never becomes 0).
 *
 * Secrets (HMAC keys, feed keys) are parsed separately by `credentials.ts`, so the Envoy
 * renderer and the deploy tooling can load this config without holding any secret.
 */
export {
  ANONYMIZER_ROUTES, CLIENT_AUTH_MODES, ConfigError, DEFAULT_ANONYMIZER_FLAGS, DEFAULT_ANONYMIZER_POLICY, DEFAULT_GEO_NOTICE,
  DEFAULT_GEOIP_DB, DEFAULT_OTEL_SERVICE_NAME, ENVOY_NON_HEAP_MB, GEO_POLICY_SETTINGS, LOG_DECISIONS, OTEL_SAMPLERS, PROXY_PROTOCOL_MODES, SHADOW_SETTINGS,
} from './config/types.ts';
export type {
  AnonymizerConfig, AnonymizerRoute, ClientAuth, Config, EdgeTlsConfig, Env, GeoRegionUnknown, GeoUnknown, LogDecisions,
  OrderBackendConfig, OtelSampler, ProxyProtocol, TierPolicy, TracingConfig,
} from './config/types.ts';
export { loadConfig } from './config/load.ts';
export { configWarnings } from './config/warnings.ts';
export { checkSettingNames, KNOWN_SETTINGS, SETTING_PREFIXES, unknownSettings, type UnknownSetting } from './config/names.ts';
