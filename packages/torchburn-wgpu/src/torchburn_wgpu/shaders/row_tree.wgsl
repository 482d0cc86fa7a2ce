// The whole workgroup (256 threads) folding one value per thread: each thread stores its value in
// `partial[lid]`, then calls `tree`, which returns the sum (or the max) to every thread.

var<workgroup> partial: array<f32, 256>;

fn tree(lid: u32, is_max: bool) -> f32 {
    workgroupBarrier();
    for (var width = 128u; width > 0u; width >>= 1u) {
        if (lid < width) {
            let other = partial[lid + width];
            partial[lid] = select(partial[lid] + other, max(partial[lid], other), is_max);
        }
        workgroupBarrier();
    }
    let total = partial[0];
    workgroupBarrier();
    return total;
}
