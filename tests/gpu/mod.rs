//! Whether a GPU test runs: without a GPU it says so and returns (CPU CI stays green);
//! with `BROOK_REQUIRE_GPU=1` a missing GPU fails.

pub fn have_gpu() -> bool {
    let required = std::env::var("BROOK_REQUIRE_GPU").is_ok_and(|v| v == "1");
    match brook::executor::cuda::probe() {
        Ok(()) => true,
        Err(e) if required => panic!("BROOK_REQUIRE_GPU=1 but no GPU: {e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}
