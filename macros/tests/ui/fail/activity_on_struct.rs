use waymark::prelude::*;

#[activity]
struct LoadOrder;

fn main() {}
