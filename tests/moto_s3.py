"""moto's S3 server on 127.0.0.1 for the object-storage tests: a real server, dummy credentials."""

import contextlib
import os


@contextlib.contextmanager
def moto_s3(bucket: str, secret: str = "testing-secret"):
    """(the variables a process reaches the server with, an fsspec file system on it, (host, port)).

    The variables are also set in this process, which reads the bucket too,
    and put back as they were afterwards; `bucket` exists.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir(bucket)
        yield env, fs, (host, port)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
