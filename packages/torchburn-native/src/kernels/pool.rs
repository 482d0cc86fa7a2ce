use super::conv::ConvScalar;
#[derive(Clone, Copy, Debug)]
pub struct Pool2dShape {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub h_out: usize,
    pub w_out: usize,
}
pub fn max_pool2d<T: ConvScalar>(_s: &Pool2dShape, _i: &[T], _o: &mut [T], _x: Option<&mut [i64]>) {
    unimplemented!()
}
pub fn avg_pool2d<T: ConvScalar>(
    _s: &Pool2dShape,
    _c: bool,
    _d: Option<i64>,
    _i: &[T],
    _o: &mut [T],
) {
    unimplemented!()
}
pub fn adaptive_avg_pool2d<T: ConvScalar>(
    _p: usize,
    _h: usize,
    _w: usize,
    _ho: usize,
    _wo: usize,
    _i: &[T],
    _o: &mut [T],
) {
    unimplemented!()
}
