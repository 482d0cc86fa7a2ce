use super::gemm::GemmScalar;
pub trait ConvScalar: GemmScalar {}
impl ConvScalar for f32 {}
impl ConvScalar for f64 {}
#[derive(Clone, Copy, Debug)]
pub struct Conv2dShape {
    pub n: usize,
    pub c_in: usize,
    pub h: usize,
    pub w: usize,
    pub c_out: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub h_out: usize,
    pub w_out: usize,
}
#[derive(Clone, Copy, Debug)]
pub struct ConvTranspose2dShape {
    pub n: usize,
    pub c_in: usize,
    pub h: usize,
    pub w: usize,
    pub c_out: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub h_out: usize,
    pub w_out: usize,
    pub output_padding: [usize; 2],
}
pub fn conv2d<T: ConvScalar>(_s: &Conv2dShape, _i: &[T], _w: &[T], _b: Option<&[T]>, _o: &mut [T]) {
    unimplemented!()
}
pub fn conv_transpose2d<T: ConvScalar>(
    _s: &ConvTranspose2dShape,
    _i: &[T],
    _w: &[T],
    _b: Option<&[T]>,
    _o: &mut [T],
) {
    unimplemented!()
}
