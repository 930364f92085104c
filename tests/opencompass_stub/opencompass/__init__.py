"""A minimal stand-in for OpenCompass (only what DARE's plug-in touches), used by the tests when the real
package is not installed. It mirrors the interface of ``opencompass.models.base.BaseModel`` (0.5.x): the
constructor arguments, ``template_parser``, ``parse_template`` and the ``*_from_template`` entry points the
inferencers call."""

__version__ = "stub"
