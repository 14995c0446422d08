"""Columns in and out (docs/python.md, "Columns"): what `Writer.write_columns` takes, turned into
the numpy arrays and null masks the native writer reads, and the native reader's arrays turned
into dicts of numpy arrays or pandas frames. numpy is needed only by these calls, pandas only
where a DataFrame is given or asked for."""
import sys


def _numpy():
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - Debian's python3-numpy is installed with us
        raise ImportError("columns need numpy (Debian: python3-numpy)") from e
    return numpy


def _pandas(needed=False):
    """pandas if this process imported it (a DataFrame or Series can only come from it; an
    import would cost a worker half a second), or when needed; None if it cannot be had."""
    pandas = sys.modules.get("pandas")
    if pandas is None and needed:
        try:
            import pandas
        except ImportError as e:
            raise ImportError("pandas frames need pandas (Debian: python3-pandas)") from e
    return pandas


_KINDS = "iufbOUS"


def _from_numpy(np, name, values, nulls=None):
    if values.ndim != 1:
        raise ValueError(f"column {name!r} has {values.ndim} dimensions; a column has one")
    if values.dtype.kind not in _KINDS or (values.dtype.kind == "f" and values.itemsize not in (4, 8)):
        raise TypeError(f"column {name!r} has dtype {values.dtype}: columns carry ints, floats "
                        "(32 or 64 bits), bools, str, bytes and nulls; convert it first")
    values = np.ascontiguousarray(values)
    if nulls is not None:
        nulls = np.ascontiguousarray(nulls, dtype=bool)
        if not nulls.any():
            nulls = None
    return (name, values, nulls)


def _from_pandas(np, pd, name, col):
    dtype = col.dtype
    if isinstance(dtype, np.dtype):
        values = col.to_numpy()
        nulls = pd.isna(values) if dtype.kind == "O" else None  # None, NaN, NA, NaT: pandas' nulls
        return _from_numpy(np, name, values, nulls)
    if isinstance(dtype, pd.StringDtype):
        return _from_numpy(np, name, col.to_numpy(dtype=object, na_value=None))
    numpy_dtype = getattr(dtype, "numpy_dtype", None)
    if (isinstance(dtype, pd.api.extensions.ExtensionDtype) and numpy_dtype is not None and
            numpy_dtype.kind in "iufb" and hasattr(col, "isna")):
        # The nullable Int*, UInt*, Float* and boolean dtypes: values and a mask.
        nulls = np.asarray(col.isna(), dtype=bool)
        values = col.to_numpy(dtype=numpy_dtype, na_value=numpy_dtype.type(0))
        return _from_numpy(np, name, values, nulls)
    raise TypeError(f"column {name!r} has dtype {dtype}: columns carry ints, floats (32 or 64 "
                    "bits), bools, str, bytes and nulls; convert it first")


def is_pandas_frame(obj):
    pd = _pandas()
    return pd is not None and isinstance(obj, pd.DataFrame)


def columns_in(columns):
    """[(name, ndarray, nulls or None)] from a DataFrame or a mapping of name -> ndarray, pandas
    Series or list."""
    np = _numpy()
    pd = _pandas()
    if pd is not None and isinstance(columns, pd.DataFrame):
        if not columns.columns.is_unique:
            raise ValueError("the DataFrame has two columns of one name")
        items = [(name, columns[name]) for name in columns.columns]
    elif hasattr(columns, "items"):
        items = list(columns.items())
    else:
        raise TypeError("write_columns takes a pandas DataFrame or a mapping of column name -> "
                        f"numpy array, pandas Series or list, not {type(columns).__name__}")
    out = []
    for name, col in items:
        if not isinstance(name, str):
            raise TypeError(f"column names are str, not {type(name).__name__} ({name!r})")
        if pd is not None and isinstance(col, (pd.Series, pd.Index, pd.api.extensions.ExtensionArray)):
            out.append(_from_pandas(np, pd, name, col))
        elif isinstance(col, np.ma.MaskedArray):  # what frames() gives for fields with nils
            out.append(_from_numpy(np, name, np.ma.getdata(col), np.ma.getmaskarray(col)))
        elif isinstance(col, np.ndarray):
            out.append(_from_numpy(np, name, col))
        elif isinstance(col, (list, tuple)):
            values = np.empty(len(col), dtype=object)  # element by element: no numpy coercion
            values[:] = col
            out.append(_from_numpy(np, name, values))
        else:
            raise TypeError(f"column {name!r} is a {type(col).__name__}: give a numpy array, a "
                            "pandas Series or a list")
    return out


def _masked(np, pd, values, mask, as_pandas):
    if mask is None:
        return values
    if not as_pandas:
        return np.ma.masked_array(values, mask=mask)
    kind = values.dtype.kind
    if kind == "b":
        return pd.arrays.BooleanArray(values, mask)
    if kind in "iu":
        return pd.arrays.IntegerArray(values, mask)
    return pd.arrays.FloatingArray(values, mask)


def _cast(np, name, values, mask, dtype):
    """values as `dtype` (a numeric or bool one), checked: a value the cast would change (an
    int out of range, a fraction cut, a float that is not a whole int) raises ValueError."""
    target = np.dtype(dtype)
    if target.kind not in "iufb" or values.dtype.kind not in "iufb":
        raise TypeError(f"dtypes: column {name!r} is {values.dtype} and the dtype asked is "
                        f"{target}: only numeric and bool columns are cast (convert others "
                        "yourself)")
    if target == values.dtype:
        return values
    with np.errstate(all="ignore"):
        cast = values.astype(target)
        back = cast.astype(values.dtype)
    same = (back == values) | (np.isnan(values) & np.isnan(back) if values.dtype.kind == "f"
                               else False)
    if values.dtype.kind in "iu" and target.kind in "iu":  # a wrap keeps the bits, not the sign
        same &= (cast < 0) == (values < 0)
    if mask is not None:
        same |= mask
    if not np.all(same):
        row = int(np.argmin(same))
        raise ValueError(f"dtypes: column {name!r} row {row} holds {values[row]!r}, which "
                         f"{target} cannot hold exactly")
    return cast


def frame_of(native_columns, rows, as_pandas, dtypes=None):
    """A batch's columns as {name: ndarray} (masked arrays where there are nulls) or a
    DataFrame (pandas' nullable dtypes where there are nulls); `dtypes` casts named numeric
    columns, checked."""
    np = _numpy()
    pd = _pandas(needed=True) if as_pandas else None
    if dtypes:
        names = {name for name, _, _ in native_columns}
        missing = [name for name in dtypes if name not in names]
        if missing and native_columns:
            raise ValueError(f"dtypes names no column {missing[0]!r} (the columns: "
                             f"{', '.join(sorted(names))})")
        native_columns = [(name, _cast(np, name, values, mask, dtypes[name])
                           if name in dtypes else values, mask)
                          for name, values, mask in native_columns]
    cols = {name: _masked(np, pd, values, mask, as_pandas) for name, values, mask in native_columns}
    if not as_pandas:
        return cols
    return pd.DataFrame(cols, index=pd.RangeIndex(rows), copy=False)


def sliced(frame, start, end):
    if isinstance(frame, dict):
        return {name: values[start:end] for name, values in frame.items()}
    return frame.iloc[start:end]
