"""Reading and writing Caffe's files; also pycaffe's ``caffe.io`` helpers (see :mod:`.pycaffe_io`)."""
