pub fn softmax_f32(_a: usize, _n: usize, _i: usize, _x: &[f32], _o: &mut [f32], _l: bool) {
    unimplemented!()
}
pub fn softmax_f64(_a: usize, _n: usize, _i: usize, _x: &[f64], _o: &mut [f64], _l: bool) {
    unimplemented!()
}
