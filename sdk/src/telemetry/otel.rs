//! OpenTelemetry export of Waymark's spans (feature `otel`): `waymark.run` per executor run and
//! `waymark.step` per step, with `workflow_id`, `workflow`, `seq`, `kind`, `name`, `attempt`,
//! `replay_mode`, `executed` and `outcome` as attributes, so a trace shows which steps ran and
//! which were replayed from the journal.
//!
//! ```no_run
//! # #[cfg(feature = "otel")] {
//! use tracing_subscriber::layer::SubscriberExt;
//! use waymark::telemetry::otel::{self, opentelemetry_sdk::trace::SdkTracerProvider};
//!
//! let provider = SdkTracerProvider::builder().build(); // add your exporter here
//! let subscriber = tracing_subscriber::registry().with(otel::layer(&provider));
//! tracing::subscriber::set_global_default(subscriber).unwrap();
//! # }
//! ```

pub use opentelemetry;
pub use opentelemetry_sdk;
pub use tracing_opentelemetry;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::registry::LookupSpan;

/// A `tracing` layer exporting spans through `provider`, under the instrumentation scope
/// `waymark`. The provider's exporter and processor decide where they go and when.
pub fn layer<S>(provider: &SdkTracerProvider) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("waymark"))
}
