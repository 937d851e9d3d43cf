// Every mistake is reported in one build, not one per build.
use waymark::prelude::*;

#[activity(retries = 3, max_attempts = "3")]
fn charge<T>(cx: u64, (a, b): (u64, u64), context: ActivityContext) -> u64 {
    let _ = (context, a, b);
    cx
}

fn main() {}
